(TOP (S (NP (NN Profits)) (VP (VBD rose) (ADVP (RB yesterday))) (. .)))
(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP-X (RB up))) (. .)))

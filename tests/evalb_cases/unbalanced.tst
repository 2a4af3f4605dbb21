(TOP (S (NP (DT a) (NN b)) (VP (VBZ c)) (. .))
(TOP (S (NP (DT a) (NN b)) (VP (VBZ c)) (. .)))
(TOP (S (NP (DT a) (NN b)) (VP (VBZ c)) (. .)))

(TOP (S (VP (VB go) (RB now)) (. .)))
(TOP (S (NP (PRP We)) (VP (VB go) (ADVP (RB now))) (. .)))
(TOP (S (NP (PRP We)) (VP (VB went)) (. .)))

(TOP (S (NP (PRP We) (VB go)) (ADVP (RB now)) (. .)))

(TOP (S (X) (VP (VBZ runs) (NP (DT a) (NN shop) (Y))) (. .)))
(TOP (S (NP (DT a) (NN shop)) (X) (VP (VBZ runs) (Z)) (. .)))

(TOP (S (NP (DT a) (NN b)) (Y (VBZ c)) (PRT (RB d)) (. .)))
(TOP (S (NP (DT a) (NN b) (VBZ c)) (. .)))

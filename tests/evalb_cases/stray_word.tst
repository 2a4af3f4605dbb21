(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (. .)))
(TOP (S (NP (NNP Haag)) plays (. .)))

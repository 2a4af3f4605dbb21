(TOP (S (NP (NNP Haag)) (VP (VBZ works)) (. .)))
(TOP (S (NP (NNP Haag)) (VP (VBZ works)) (. .)))
(TOP (S (NP (NNP Haag)) (VP (VBZ works)) (. .)))
(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (. .)))

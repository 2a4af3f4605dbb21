(TOP (S (NP (NNP Haag)) (VP (. plays)) (NN .)))
(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (, .)))
(TOP (S (NP (NNP Haag)) (VP (VBZ plays)) (NN .)))
(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .)))

(TOP (S (NP (NP (NNS dogs) ('' ')) (NN bone)) (VP (VBZ is) (ADJP (JJ big))) (. .)))
(TOP (S (NP (NP (NNS dogs) (POS ')) (NN bone)) (VP (VBZ is) (ADJP (JJ big))) (. .)))
(TOP (S (NP (NNP Sam) ('' ')) (VP (VBZ says) (`` ") (NP (NN yes)) (NN ")) (. .)))

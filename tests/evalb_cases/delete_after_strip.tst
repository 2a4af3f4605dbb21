(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))
(ROOT (S (NP (DT The) (NN cat)) (VP (VBD sat)) (PERIOD .)))
(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (.-X .)))
(TOP=2 (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))

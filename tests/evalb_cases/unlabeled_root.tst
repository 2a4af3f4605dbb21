( (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)) )
(TOP (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))
( (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)) )
( (S (NP (DT The)) (VP (NN cat) (VBD sat)) (. .)) )

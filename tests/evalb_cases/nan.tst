(TOP (NN Yes))
(TOP (UH Hi) (. !))

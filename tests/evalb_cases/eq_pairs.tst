(S (C (D x) (E w)) (B (D w)))
(S (B (D x) (E w)) (A (D w)))
(S (A (D z) (E w)) (B (D w)))
(S (A (D y) (F w)) (B (G w)))

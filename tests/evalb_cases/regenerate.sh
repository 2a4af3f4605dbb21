#!/bin/sh
# Records EVALB's own output for every case in this folder: for CASE.gld and CASE.tst (scored
# with CASE.prm, or COLLINS.prm when there is none) it writes CASE.rsl (EVALB's report, its
# stdout), CASE.err (its stderr) and CASE.rc (its exit status). tests/test_evalb.py checks that
# keras_transformer.evaluation.evalb reproduces them; the tests never run EVALB themselves.
#
#   sh tests/evalb_cases/regenerate.sh /path/to/evalb
#
# where /path/to/evalb is the C program of EVALB's public-domain distribution (Sekine & Collins;
# `evalb.c`, built with `gcc -o evalb evalb.c`), e.g. the copy in the EVALB/ folder of
# github.com/nikitakit/self-attentive-parser.
set -eu
evalb=$(realpath "$1")
cd "$(dirname "$0")"
for gold in *.gld; do
    case=${gold%.gld}
    prm=$case.prm
    [ -f "$prm" ] || prm=COLLINS.prm
    rc=0
    "$evalb" -p "$prm" "$case.gld" "$case.tst" > "$case.rsl" 2> "$case.err" || rc=$?
    echo "$rc" > "$case.rc"
done

#!/bin/sh
# Runs `python -m <stage> ARGS...` for a stage or a stage's module (preprocess.data_gate,
# evaluate.rewrite_trend), any other command as given.
set -e
# compose names the run's folder by RUN_DATE: anything but a calendar date YYYY-MM-DD
# (20260131, 2026-02-30, ../x) is refused here in one line, exit 2, before any stage starts.
if [ -n "${RUN_DATE+set}" ]; then
  python -m contract.dates "$RUN_DATE" || exit $?
fi
case "$1" in
  preprocess | train | evaluate | preprocess.* | train.* | evaluate.*) exec python -m "$@" ;;
  luigi) shift; exec luigi "$@" ;;
  *) exec "$@" ;;
esac

#!/bin/sh
# Runs `python -m <stage> ARGS...` for a stage name, any other command as given.
set -e
case "$1" in
  preprocess | train | evaluate) exec python -m "$@" ;;
  luigi) shift; exec luigi "$@" ;;
  *) exec "$@" ;;
esac

#!/bin/sh
# A user's own benchmark, as a team keeps one: a busy loop, a score line and what it was given.
n=${LOOPS:-20000}
i=0
while [ "$i" -lt "$n" ]; do i=$((i + 1)); done
echo "loops: $i"
echo "score: $((i / 100)) ops"
echo "input: $(cat data/input.txt)"
echo "trial: $(wc -l < before-each.log)"

#!/bin/sh
# Keeps llama-server's --log-file from filling the disk (about 5 KB per request at -lv 4):
# when the file holds more than MAX_MB of data, its new part is gzipped to LOG.1.gz (older
# copies shift up to LOG.KEEP.gz) and the file is truncated in place (copytruncate), because
# llama-server keeps the file open and cannot be told to reopen it.
#
# llama-server opens its log without O_APPEND, so after a truncation it goes on writing at its
# old offset: the file starts with a hole (no disk used, reads as zeros) and its apparent size
# (ls) keeps growing while its disk use (du) stays below MAX_MB. The exporter skips the hole;
# this script copies only what was written since the last rotation, and never reads the hole:
# the size comes from stat (wc -c reads every byte: 82 s for a 20 GB hole) and the copy seeks
# past it with dd (busybox's tail -c +N refuses offsets above 4 GiB).
#
#   rotate.sh            check every INTERVAL seconds
#   rotate.sh --once     check once (tests, cron)
set -eu
LOG=${LOG:-/logs/llama-server.log}
MAX_MB=${MAX_MB:-100}
KEEP=${KEEP:-3}
INTERVAL=${INTERVAL:-60}
STATE="$LOG.rotated-at"   # apparent size at the last truncation: where new data starts
CHECKED="$LOG.checked"    # touched at every check: the container's health check reads its age

rotate() {
  start=0
  [ -f "$STATE" ] && start=$(cat "$STATE")
  size=$(stat -c %s "$LOG")
  [ "$start" -le "$size" ] || start=0   # llama-server restarted and rewrote the file from 0
  i=$KEEP
  while [ "$i" -gt 1 ]; do
    prev=$((i - 1))
    if [ -f "$LOG.$prev.gz" ]; then mv "$LOG.$prev.gz" "$LOG.$i.gz"; fi
    i=$prev
  done
  dd if="$LOG" bs=65536 iflag=skip_bytes skip="$start" 2>/dev/null | tr -d '\000' | gzip > "$LOG.1.gz.tmp"
  mv "$LOG.1.gz.tmp" "$LOG.1.gz"
  echo "$size" > "$STATE"
  : > "$LOG"
}

while :; do
  if [ -f "$LOG" ] && [ "$(du -k "$LOG" | cut -f1)" -gt $((MAX_MB * 1024)) ]; then
    rotate
  fi
  touch "$CHECKED"
  if [ "${1:-}" = "--once" ]; then exit 0; fi
  sleep "$INTERVAL"
done

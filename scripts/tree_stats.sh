#!/usr/bin/env bash
# The source tree as the repository tracks it: every folder with its number of files and lines
# (the folder's own files, not its sub-folders'), and the totals. Usage: scripts/tree_stats.sh
set -euo pipefail
cd "$(dirname "$0")/.."

git ls-files -z | xargs -0 -r wc -l 2>/dev/null | grep -v ' total$' | awk '
  {
    lines = $1; path = $0; sub(/^ *[0-9]+ /, "", path)
    dir = path; sub(/\/[^\/]*$/, "", dir); if (dir == path) dir = "."
    files[dir]++; count[dir] += lines; all_files++; all_lines += lines
  }
  END {
    printf "%-28s %6s %8s\n", "folder", "files", "lines"
    n = 0
    for (d in files) order[++n] = d
    # insertion sort by name (awk has no portable sort)
    for (i = 2; i <= n; i++) {
      v = order[i]; j = i - 1
      while (j > 0 && order[j] > v) { order[j + 1] = order[j]; j-- }
      order[j + 1] = v
    }
    for (i = 1; i <= n; i++) printf "%-28s %6d %8d\n", order[i] "/", files[order[i]], count[order[i]]
    printf "%-28s %6d %8d\n", "total", all_files, all_lines
  }'

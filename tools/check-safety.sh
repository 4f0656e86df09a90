#!/usr/bin/env bash
# Checks that SAFETY.md lists every unsafe site of ffi/, and no site that is gone.
#
#   tools/check-safety.sh          compare; exit 1 naming every difference
#   tools/check-safety.sh --list   print the site lines of the source, in SAFETY.md's format
#
# A site is an `unsafe` block, `unsafe fn`, `unsafe impl`, `unsafe trait`, `unsafe extern`
# block or `unsafe(...)` attribute in a `.rs` file under ffi/ (target/ aside). Sites are
# named by file and by the function they are in, qualified by the type of the enclosing
# `impl` (`Connection::poll`); an `unsafe impl` is named `Trait for Type`. SAFETY.md names
# them in lines of this form, anywhere in the file outside fenced code blocks (the entry of
# the site explains it):
#
#   - `ffi/src/net.rs` `recv_urgent_byte`: 1 block
#   - `ffi/src/alloc.rs` `CountingAllocator::alloc`: unsafe fn, 1 block
#   - `ffi/src/alloc.rs` `GlobalAlloc for CountingAllocator`: unsafe impl
#
# The same name may appear in several entries (one function with unrelated blocks); the
# counts are added up. The scanner reads Rust token by token, skipping comments, strings and
# character literals, and tracks braces, so it needs no marker in the source.
set -euo pipefail
cd "$(dirname "$0")/.."

ledger=SAFETY.md
list_only=false
[ "${1:-}" = --list ] && list_only=true

# Prints one line per site: "FILE<TAB>NAME<TAB>KIND".
scan() {
  find ffi -name target -prune -o -name '*.rs' -print | LC_ALL=C sort | while read -r f; do
    awk -v file="$f" '
      # Pass 1 (per line, with state carried across lines): blank comments, strings and
      # char literals, so that only code reaches the tokenizer.
      function clean(line,   out, i, c, n, c2, j, hashes) {
        out = ""; i = 1; n = length(line)
        while (i <= n) {
          c = substr(line, i, 1); c2 = substr(line, i, 2)
          if (bc > 0) {                       # inside /* */ (nests in Rust)
            if (c2 == "*/") { bc--; i += 2 } else if (c2 == "/*") { bc++; i += 2 } else i++
            continue
          }
          if (instr) {                        # inside "..." or r#"..."#
            if (rawh >= 0) {
              hashes = ""; for (j = 0; j < rawh; j++) hashes = hashes "#"
              if (substr(line, i, 1 + rawh) == "\"" hashes) { instr = 0; i += 1 + rawh; out = out " STR "; rawh = -1 } else i++
            } else if (c == "\\") i += 2
            else if (c == "\"") { instr = 0; i++; out = out " STR " }
            else i++
            continue
          }
          if (c2 == "//") break
          if (c2 == "/*") { bc = 1; i += 2; continue }
          if (c == "\"") { instr = 1; rawh = -1; i++; continue }
          if (c == "r" && match(substr(line, i), /^r#*"/) && (i == 1 || substr(line, i - 1, 1) !~ /[A-Za-z0-9_]/)) {
            rawh = RLENGTH - 2; instr = 1; i += RLENGTH; continue
          }
          if (c == "\x27") {                  # a char literal, or a lifetime (left alone)
            if (substr(line, i + 1, 1) == "\\") {
              j = index(substr(line, i + 2), "\x27"); if (j > 0) { i += j + 2; out = out " CHR "; continue }
            } else if (substr(line, i + 2, 1) == "\x27") { i += 3; out = out " CHR "; continue }
          }
          out = out c; i++
        }
        return out
      }
      function tokenize(s,   t) {
        while (s != "") {
          if (match(s, /^[ \t\r]+/)) { s = substr(s, RLENGTH + 1); continue }
          if (match(s, /^[A-Za-z_][A-Za-z0-9_]*/) || match(s, /^[0-9][A-Za-z0-9_.]*/) || match(s, /^(::|->|=>)/)) {
            t = substr(s, 1, RLENGTH); s = substr(s, RLENGTH + 1)
          } else { t = substr(s, 1, 1); s = substr(s, 2) }
          tok[++ntok] = t; tokline[ntok] = NR
        }
      }
      BEGIN { bc = 0; instr = 0; rawh = -1; ntok = 0 }
      { tokenize(clean($0)) }
      function site(name, kind) { printf "%s\t%s\t%s\n", file, name, kind }
      # The innermost enclosing function, qualified by the innermost enclosing impl type.
      function here(   k, fn, ty) {
        fn = ""; ty = ""
        for (k = depth; k >= 1; k--) {
          if (fn == "" && skind[k] == "fn") fn = sname[k]
          if (ty == "" && skind[k] == "impl") ty = sname[k]
        }
        if (fn == "") return ty == "" ? "(top level)" : ty
        return ty == "" ? fn : ty "::" fn
      }
      # The type of the innermost enclosing impl, or "".
      function owner(   k) {
        for (k = depth; k >= 1; k--) if (skind[k] == "impl") return sname[k]
        return ""
      }
      # Reads an impl header from token i (just after `impl`) up to its `{`: sets htrait
      # and htype (last path segments, generics skipped) and returns the index of `{`.
      function impl_header(i,   angle, part, last, t) {
        angle = 0; htrait = ""; htype = ""; last = ""; part = "type"
        for (; i <= ntok; i++) {
          t = tok[i]
          if (angle == 0 && (t == "{" || t == ";" || t == "where")) break
          if (t == "<") { angle++; continue }
          if (t == ">") { if (angle > 0) angle--; continue }
          if (t == "->") continue
          if (angle > 0) continue
          if (t == "for") { htrait = last; last = ""; continue }
          if (t ~ /^[A-Za-z_][A-Za-z0-9_]*$/ && t != "dyn" && t != "mut" && t != "const" && t != "unsafe") last = t
        }
        htype = last
        while (i <= ntok && tok[i] != "{" && tok[i] != ";") i++
        return i
      }
      END {
        depth = 0; pend_kind = ""; paren = 0
        for (i = 1; i <= ntok; i++) {
          t = tok[i]
          if (t == "(" || t == "[") paren++
          else if ((t == ")" || t == "]") && paren > 0) paren--
          else if (t == ";" && paren == 0) pend_kind = ""
          else if (t == "{") {
            depth++; skind[depth] = pend_kind; sname[depth] = pend_name; pend_kind = ""; paren = 0
          } else if (t == "}") {
            if (depth > 0) depth--
          } else if (t == "fn" && tok[i + 1] ~ /^[A-Za-z_][A-Za-z0-9_]*$/) {
            pend_kind = "fn"; pend_name = tok[i + 1]
          } else if (t == "impl" && pend_kind == "" && (i == 1 || tok[i - 1] !~ /^(:|\(|,|<|->|&|=|dyn)$/)) {
            impl_header(i + 1)
            pend_kind = "impl"; pend_name = htype
          }
          if (t != "unsafe") continue
          n1 = tok[i + 1]; n2 = tok[i + 2]; n3 = tok[i + 3]; n4 = tok[i + 4]
          if (n1 == "{") site(here(), "block")
          else if (n1 == "(") {                 # #[unsafe(no_mangle)] and the like: named by their item
            for (j = i + 2; j <= ntok && j < i + 40; j++) if (tok[j] ~ /^(fn|static)$/) break
            site(j <= ntok && j < i + 40 ? tok[j + 1] : here(), "unsafe attribute")
          }
          else if (n1 == "fn" && n2 ~ /^[A-Za-z_]/) { pend_kind = "fn"; pend_name = n2; site(owner() == "" ? n2 : owner() "::" n2, "unsafe fn") }
          else if (n1 == "extern" && n2 == "STR" && n3 == "fn" && n4 ~ /^[A-Za-z_]/) { site(n4, "unsafe fn") }
          else if (n1 == "extern" && (n2 == "{" || (n2 == "STR" && n3 == "{"))) site(here(), "unsafe extern block")
          else if (n1 == "impl") {
            impl_header(i + 2)
            site((htrait == "" ? "" : htrait " for ") htype, "unsafe impl")
          } else if (n1 == "trait") site(n2, "unsafe trait")
          else if (n1 == "extern" && n3 == "fn" && n4 == "(") { }   # a function pointer type
          else if (n1 == "fn" && n2 == "(") { }                      # a function pointer type
          else printf "%s:%d: unrecognised use of unsafe (before %s %s)\n", file, tokline[i], n1, n2 > "/dev/stderr"
        }
      }
    ' "$f"
  done
}

# Sums "FILE<TAB>NAME<TAB>KIND" lines into "FILE<TAB>NAME<TAB>KIND<TAB>COUNT".
count() { LC_ALL=C sort | uniq -c | awk '{ n = $1; sub(/^ *[0-9]+ /, ""); print $0 "\t" n }'; }

# Reads SAFETY.md's site lines into "FILE<TAB>NAME<TAB>KIND<TAB>COUNT".
ledger_sites() {
  awk '
    /^[ \t]*```/ { fenced = !fenced; next }
    !fenced && /^[ \t]*- `ffi\/[^`]+` `[^`]+`: / {
      line = $0; sub(/^[ \t]*- `/, "", line)
      f = line; sub(/`.*/, "", f)
      sub(/^[^`]*` `/, "", line); name = line; sub(/`.*/, "", name)
      sub(/^[^`]*`: /, "", line); sub(/[ \t.]*$/, "", line)
      n = split(line, parts, /, /)
      for (k = 1; k <= n; k++) {
        p = parts[k]; c = 1
        if (match(p, /^[0-9]+ /)) { c = substr(p, 1, RLENGTH - 1) + 0; p = substr(p, RLENGTH + 1) }
        sub(/s$/, "", p)
        if (p !~ /^(block|unsafe fn|unsafe impl|unsafe trait|unsafe extern block|unsafe attribute)$/) {
          printf "%s:%d: cannot read \"%s\" (expected e.g. \"3 blocks\", \"unsafe fn\", \"unsafe impl\")\n", FILENAME, FNR, parts[k] > "/dev/stderr"
          bad = 1; continue
        }
        sum[f "\t" name "\t" p] += c
      }
    }
    END { for (k in sum) print k "\t" sum[k]; exit bad }
  ' "$ledger" | LC_ALL=C sort
}

# Formats "FILE<TAB>NAME<TAB>KIND<TAB>COUNT" as SAFETY.md lines, one per file and name.
format() {
  awk -F'\t' '
    function flush() { if (key != "") print "- `" pf "` `" pn "`: " kinds }
    {
      k = $1 "\t" $2
      item = ($3 == "block") ? $4 " block" ($4 == 1 ? "" : "s") : (($4 == 1 ? "" : $4 " ") $3 ($4 == 1 ? "" : "s"))
      if (k != key) { flush(); key = k; pf = $1; pn = $2; kinds = item } else kinds = kinds ", " item
    }
    END { flush() }
  '
}

source_sites=$(scan | count)
if $list_only; then
  printf '%s\n' "$source_sites" | format
  exit 0
fi
listed=$(ledger_sites) || { echo "check-safety: $ledger has site lines it cannot read (above)" >&2; exit 1; }

fail=0
total_src=0; total_led=0
while IFS=$'\t' read -r f name kind n; do
  [ -n "$f" ] || continue
  total_src=$((total_src + n))
  m=$(printf '%s\n' "$listed" | awk -F'\t' -v f="$f" -v n="$name" -v k="$kind" '$1 == f && $2 == n && $3 == k { print $4 }')
  if [ -z "$m" ]; then
    echo "check-safety: $f, $name: $n $kind site(s) with no entry in $ledger" >&2; fail=1
  elif [ "$m" -ne "$n" ]; then
    echo "check-safety: $f, $name: the source has $n $kind site(s), $ledger lists $m" >&2; fail=1
  fi
done <<< "$source_sites"
while IFS=$'\t' read -r f name kind n; do
  [ -n "$f" ] || continue
  total_led=$((total_led + n))
  if ! printf '%s\n' "$source_sites" | awk -F'\t' -v f="$f" -v n="$name" -v k="$kind" '$1 == f && $2 == n && $3 == k { found = 1 } END { exit !found }'; then
    echo "check-safety: $ledger lists $n $kind site(s) in $f, $name, which the source does not have" >&2; fail=1
  fi
done <<< "$listed"

if [ "$fail" -ne 0 ]; then
  echo "check-safety: FAILED: $total_src unsafe sites in ffi/, $total_led listed in $ledger." >&2
  echo "Each site needs a line in its $ledger entry; the source's lines are (tools/check-safety.sh --list):" >&2
  printf '%s\n' "$source_sites" | format >&2
  exit 1
fi
echo "check-safety: $total_src unsafe sites in ffi/, each listed in $ledger"

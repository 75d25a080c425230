#!/usr/bin/env python3
"""Lists product function bodies of >= --min lines (default 6) defined more than once; exit 1 when
there is one (issue 36: each helper has one home).

Usage: scripts/duplicate_functions.py [--min N] [ROOT...]   (from the repository root; ctest runs it)

Product code and the function finder are scripts/long_functions.py's (engine/, harness/, compare/,
instrument/, h5/; .cpp .h .cu .cuh). A body is the text from a function's '{' to its '}', with
comments removed and each run of white space made one space; two functions whose bodies are equal
to the letter are one helper written twice, whatever their names and parameters (an exact check:
a copy with one name changed is not found). Its length is counted in the file's lines, from the
'{' line to the '}' line. Bodies of one line `{ return x; }` and the like are well under the limit.
ROOTs replace the product folders (the test of this script plants a copy in a scratch folder).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from long_functions import EXTS, ROOTS, function_spans  # noqa: E402

COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/|R"(\w*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                     re.S)


def strip_comments(text):
    """text without its comments (string and character literals kept as they are)."""
    return COMMENT.sub(lambda m: m.group(0) if m.group(0)[0] in '"\'R' else ' ', text)


def main():
    args = sys.argv[1:]
    least = 6
    if '--min' in args:
        i = args.index('--min')
        least = int(args[i + 1])
        del args[i:i + 2]
    roots = args or ROOTS
    bodies, n_files, n_funcs = {}, 0, 0
    for root in roots:
        for d, _, files in os.walk(root):
            for f in sorted(files):
                if not f.endswith(EXTS):
                    continue
                p = os.path.join(d, f)
                n_files += 1
                raw = open(p, encoding='utf-8', errors='replace').read()
                for first, _, head, lo, hi in function_spans(p):
                    n_funcs += 1
                    lines = raw.count('\n', lo, hi) + 1
                    if lines < least:
                        continue
                    key = ' '.join(strip_comments(raw[lo:hi + 1]).split())
                    line = raw.count('\n', 0, lo) + 1
                    bodies.setdefault(key, []).append((f'{p}:{line}', lines, head[:80]))
    twice = sorted((v for v in bodies.values() if len(v) > 1), key=lambda v: -v[0][1])
    for places in twice:
        print(f'{places[0][1]:4d} lines defined {len(places)} times:')
        for where, _, head in places:
            print(f'        {where}  {head}')
    print(f'duplicate_functions: {len(twice)} bodies of >= {least} lines defined more than once, '
          f'of {n_funcs} functions in {n_files} files')
    if not args and (n_files < 100 or n_funcs < 1000):
        print('duplicate_functions: too few files or functions found: run it from the repository root')
        return 1
    return 1 if twice else 0


if __name__ == '__main__':
    sys.exit(main())

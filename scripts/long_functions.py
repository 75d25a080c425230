#!/usr/bin/env python3
"""Lists product functions longer than --max lines (default 120); exit 1 when there is one.

Usage: scripts/long_functions.py [--max N] [--all]   (from the repository root; ctest runs it)

Product code is engine/, harness/, compare/, instrument/ and h5/ (.cpp .h .cu .cuh). CUDA kernels
(`__global__`) are exempt: a kernel is one launch, and splitting it would cost registers or a
launch. A function is found by its braces: comments and string literals are blanked, namespace /
class / struct / enum / extern bodies are looked through, and any other brace block at that level
whose head (the text since the previous `;`, `{` or `}`) holds a parameter list is a function (a
member defined in its class included). Its length is the number of lines from the head's first
line to the closing brace. --all lists every function over --max without failing.
"""
import os
import re
import sys

ROOTS = ['engine', 'harness', 'compare', 'instrument', 'h5']
EXTS = ('.cpp', '.h', '.cu', '.cuh')
SCOPE = re.compile(r'\b(namespace|class|struct|union|enum)\b|extern\s*"C"|^\s*$')


def blank(src):
    """src with comments, string and character literals replaced by spaces (newlines kept)."""
    pat = re.compile(r'//[^\n]*|/\*.*?\*/|R"(\w*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pat.sub(lambda m: re.sub(r'[^\n]', ' ', m.group(0)), src)


def functions(path):
    """(first line, lines, head text) of each function body found in path."""
    return [(first, n, head) for first, n, head, _, _ in function_spans(path)]


def function_spans(path):
    """(first line, lines, head text, offset of '{', offset of '}') of each function body in path
    (the offsets index the file's text as read; scripts/duplicate_functions.py reads the bodies)."""
    src = blank(open(path, encoding='utf-8', errors='replace').read())
    # preprocessor lines, with their backslash continuations (macro bodies are not functions)
    src = re.sub(r'^[ \t]*#(?:[^\n]*\\\n)*[^\n]*', lambda m: re.sub(r'[^\n]', ' ', m.group(0)), src, flags=re.M)
    out, stack, head_start = [], [], 0  # stack: ('scope'|'func'|'block', start, head, '{' offset)
    for i, ch in enumerate(src):
        if ch == '{':
            head = src[head_start:i]
            in_func = any(e[0] != 'scope' for e in stack)
            if in_func:
                kind = 'block'
            elif SCOPE.search(head.strip().split('(')[0]) or '(' not in head or re.search(r'=\s*$', head.strip()):
                kind = 'scope'
            else:
                kind = 'func'
            start = head_start + (len(head) - len(head.lstrip()))
            stack.append((kind, start, head, i))
            head_start = i + 1
        elif ch == '}':
            if stack:
                kind, start, head, brace = stack.pop()
                if kind == 'func':
                    first = src.count('\n', 0, start) + 1
                    last = src.count('\n', 0, i) + 1
                    out.append((first, last - first + 1, ' '.join(head.split()), brace, i))
            head_start = i + 1
        elif ch == ';' and not any(e[0] != 'scope' for e in stack):
            head_start = i + 1
    return out


def main():
    limit, fail = 120, True
    args = sys.argv[1:]
    if '--max' in args:
        limit = int(args[args.index('--max') + 1])
    if '--all' in args:
        fail = False
    found, n_files, n_funcs = [], 0, 0
    for root in ROOTS:
        for d, _, files in os.walk(root):
            for f in sorted(files):
                if f.endswith(EXTS):
                    p = os.path.join(d, f)
                    n_files += 1
                    for first, n, head in functions(p):
                        n_funcs += 1
                        if n > limit and '__global__' not in head:
                            found.append((n, f'{p}:{first}', head[:100]))
    for n, where, head in sorted(found, reverse=True):
        print(f'{n:5d} lines  {where}  {head}')
    print(f'long_functions: {len(found)} of {n_funcs} product functions in {n_files} files over '
          f'{limit} lines (CUDA kernels exempt)')
    # A run that found (almost) nothing looked in the wrong place: that is not a pass.
    if n_files < 100 or n_funcs < 1000:
        print('long_functions: too few files or functions found: run it from the repository root')
        return 1
    return 1 if fail and found else 0


if __name__ == '__main__':
    sys.exit(main())

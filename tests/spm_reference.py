"""llama.cpp's SentencePiece-style tokenizer (llama-vocab.cpp: the special-token partition, then the SPM session's
bigram queue and resegmentation), step for step in plain Python: the reference my_ops.hf.gguf_tokenizer is checked
against. It shares nothing with it but the file's vocabulary, and is slow (a heap per text fragment)."""

from __future__ import annotations

import heapq

CONTROL, UNKNOWN, USER_DEFINED = 3, 2, 4


class SpmReference:
    def __init__(self, tokens, scores, types, *, bos=None, add_bos=True, add_space_prefix=True):
        self.tokens, self.scores = list(tokens), list(scores)
        self.index = {}
        for i, token in enumerate(self.tokens):  # llama.cpp's token_to_id: a later equal text wins
            self.index[token] = i
        self.special = [i for i, k in enumerate(types) if k in (CONTROL, UNKNOWN, USER_DEFINED)]
        self.special.sort(key=lambda i: -len(self.tokens[i].encode()))  # longest (in bytes) first
        self.user_defined = {i for i in self.special if types[i] == USER_DEFINED}
        self.bos, self.add_bos, self.add_space_prefix = bos, add_bos, add_space_prefix

    def partition(self, text: str, parse_special: bool):
        """tokenizer_st_partition: each special token, longest first, cut out of every raw fragment, left to right."""
        fragments = [text] if text else []
        for token_id in self.special:
            if not parse_special and token_id not in self.user_defined:
                continue
            needle = self.tokens[token_id]
            if not needle:
                continue
            out = []
            for fragment in fragments:
                if not isinstance(fragment, str):
                    out.append(fragment)
                    continue
                start = 0
                while (found := fragment.find(needle, start)) >= 0:
                    if found > start:
                        out.append(fragment[start:found])
                    out.append(token_id)
                    start = found + len(needle)
                if start < len(fragment):
                    out.append(fragment[start:])
            fragments = out
        return fragments

    def encode(self, text: str, parse_special: bool = True) -> list[int]:
        output = [self.bos] if self.add_bos and self.bos is not None else []
        previous_special = True
        for fragment in self.partition(text, parse_special):
            if isinstance(fragment, int):
                output.append(fragment)
                previous_special = True
                continue
            if self.add_space_prefix and previous_special:
                fragment = " " + fragment
            output += self._session(fragment.replace(" ", "\u2581"))
            previous_special = False
        return output

    def _session(self, text: str) -> list[int]:
        # Symbols are UTF-8 characters in a linked list; a merged symbol spans the text of both.
        symbols = [[i - 1, i + 1, ch] for i, ch in enumerate(text)]  # prev, next, text
        if symbols:
            symbols[-1][1] = -1
        queue = []

        def add_bigram(left: int, right: int):
            if left == -1 or right == -1:
                return
            merged = symbols[left][2] + symbols[right][2]
            token = self.index.get(merged)
            if token is None:
                return
            # highest score first; among equal scores the leftmost (llama.cpp's comparator)
            heapq.heappush(queue, (-self.scores[token], left, right, len(merged)))

        for i in range(1, len(symbols)):
            add_bigram(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            left_symbol, right_symbol = symbols[left], symbols[right]
            if not left_symbol[2] or not right_symbol[2] or len(left_symbol[2]) + len(right_symbol[2]) != size:
                continue  # one of them was merged since
            left_symbol[2] += right_symbol[2]
            right_symbol[2] = ""
            left_symbol[1] = right_symbol[1]
            if right_symbol[1] != -1:
                symbols[right_symbol[1]][0] = left
            add_bigram(left_symbol[0], left)
            add_bigram(left, left_symbol[1])

        output = []
        i = 0 if symbols else -1
        while i != -1:
            self._resegment(symbols[i][2], output)
            i = symbols[i][1]
        return output

    def _resegment(self, text: str, output: list[int]) -> None:
        token = self.index.get(text)
        if token is not None:
            output.append(token)
            return
        for byte in text.encode():  # every merge made a token, so this is a character that is none
            output.append(self.index[f"<0x{byte:02X}>"])

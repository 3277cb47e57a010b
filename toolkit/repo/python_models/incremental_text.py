"""Incremental detokenization for streaming: each new piece of text at a constant cost per token.

Each step decodes two short windows of the token sequence, both starting a few tokens before the new
tokens (left context, so a tokenizer that merges bytes or spaces across tokens decodes the new piece as it
would in the whole text), and passes on their difference. A piece whose decoding ends in a partial UTF-8
character (U+FFFD) is held back until the token that completes it arrives. The same scheme as vLLM's
incremental detokenizer. Pure Python: imported by the BLS model inside Triton and by the tests.
"""

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4


class IncrementalText:
    def __init__(self):
        self.tokens: list[int] = []
        self.prefix = 0  # tokens[prefix:read] were passed on already and are decoded again as context
        self.read = 0

    def windows(self, new_tokens: list[int]) -> tuple[list[int], list[int]]:
        """Add the new tokens; the two token lists to decode: context only, context + new."""
        self.tokens.extend(new_tokens)
        return self.tokens[self.prefix:self.read], self.tokens[self.prefix:]

    def delta(self, context_text: str, full_text: str, hold_partial: bool = True) -> str:
        """The new text, given the decodings of the two windows; advances past it unless it is held back."""
        if hold_partial and full_text.endswith(REPLACEMENT):
            return ""
        piece = full_text[len(context_text):] if full_text.startswith(context_text) else full_text
        self.prefix, self.read = max(self.read - CONTEXT_TOKENS, 0), len(self.tokens)
        return piece

"""A tiny, randomly initialised chat model built offline: the embedded default and the tests' model.

`build_tiny_model(path)` trains a byte-level BPE tokenizer on a small built-in corpus (Python
programs and English in the style of the pipeline's prompts), wraps it as a fast tokenizer with a
ChatML chat template (`<|im_start|>role\\n...<|im_end|>`, `add_generation_prompt`, and Qwen3's
`enable_thinking=False` convention), creates a Qwen2-shaped model with random weights, and saves
both with `save_pretrained`. Everything is deterministic given the seed and takes about a second.
The model's output is noise; it exercises the plumbing (templates, batching, usage, serving).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TOKENS = ["<think>", "</think>"]
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Jinja string literals interpret '\n' as a newline (the template text itself has none).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)

_PROGRAMS = [
    """
    import sys

    def main():
        data = sys.stdin.read().split()
        n = int(data[0])
        values = list(map(int, data[1:1 + n]))
        total = 0
        for value in values:
            if value % 2 == 0:
                total += value
        print(total)

    if __name__ == "__main__":
        main()
    """,
    """
    from collections import defaultdict, deque

    def bfs(graph, start):
        dist = {start: 0}
        queue = deque([start])
        while queue:
            node = queue.popleft()
            for nxt in graph[node]:
                if nxt not in dist:
                    dist[nxt] = dist[node] + 1
                    queue.append(nxt)
        return dist

    n, m = map(int, input().split())
    graph = defaultdict(list)
    for _ in range(m):
        a, b = map(int, input().split())
        graph[a].append(b)
        graph[b].append(a)
    print(max(bfs(graph, 1).values()))
    """,
    """
    class Solution:
        def twoSum(self, nums: list[int], target: int) -> list[int]:
            seen = {}
            for i, num in enumerate(nums):
                if target - num in seen:
                    return [seen[target - num], i]
                seen[num] = i
            return []
    """,
    """
    import heapq

    def dijkstra(n, edges, source):
        adj = [[] for _ in range(n)]
        for u, v, w in edges:
            adj[u].append((v, w))
        best = [float("inf")] * n
        best[source] = 0
        heap = [(0, source)]
        while heap:
            d, u = heapq.heappop(heap)
            if d > best[u]:
                continue
            for v, w in adj[u]:
                if d + w < best[v]:
                    best[v] = d + w
                    heapq.heappush(heap, (best[v], v))
        return best
    """,
    """
    t = int(input())
    for _ in range(t):
        s = input().strip()
        count = 0
        for i in range(len(s) - 1):
            if s[i] == s[i + 1]:
                count += 1
        print("YES" if count % 2 == 0 else "NO")
    """,
    """
    def solve(a, b):
        dp = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
        for i in range(1, len(a) + 1):
            for j in range(1, len(b) + 1):
                if a[i - 1] == b[j - 1]:
                    dp[i][j] = dp[i - 1][j - 1] + 1
                else:
                    dp[i][j] = max(dp[i - 1][j], dp[i][j - 1])
        return dp[-1][-1]

    print(solve(input(), input()))
    """,
    """
    import sys
    from functools import lru_cache

    sys.setrecursionlimit(10000)

    @lru_cache(maxsize=None)
    def ways(remaining, largest):
        if remaining == 0:
            return 1
        if remaining < 0 or largest == 0:
            return 0
        return ways(remaining - largest, largest) + ways(remaining, largest - 1)

    def read_ints():
        return [int(token) for token in sys.stdin.readline().split()]

    q = int(sys.stdin.readline())
    answers = []
    for _ in range(q):
        n, k = read_ints()
        answers.append(str(ways(n, k) % 1_000_000_007))
    sys.stdout.write("\\n".join(answers) + "\\n")
    """,
    """
    import bisect
    import math
    from itertools import accumulate, combinations, permutations

    def longest_increasing_subsequence(sequence):
        tails = []
        for item in sequence:
            position = bisect.bisect_left(tails, item)
            if position == len(tails):
                tails.append(item)
            else:
                tails[position] = item
        return len(tails)

    def prefix_sums(array):
        return [0, *accumulate(array)]

    def gcd_of_list(numbers):
        result = 0
        for number in numbers:
            result = math.gcd(result, number)
        return result

    def is_prime(x):
        if x < 2:
            return False
        return all(x % d for d in range(2, math.isqrt(x) + 1))

    words = input().split()
    best = max(permutations(words), key=lambda p: "".join(p))
    print(" ".join(best), sum(1 for c in combinations(range(len(words)), 2)))
    """,
    """
    class UnionFind:
        def __init__(self, size):
            self.parent = list(range(size))
            self.rank = [0] * size

        def find(self, x):
            while self.parent[x] != x:
                self.parent[x] = self.parent[self.parent[x]]
                x = self.parent[x]
            return x

        def union(self, a, b):
            ra, rb = self.find(a), self.find(b)
            if ra == rb:
                return False
            if self.rank[ra] < self.rank[rb]:
                ra, rb = rb, ra
            self.parent[rb] = ra
            if self.rank[ra] == self.rank[rb]:
                self.rank[ra] += 1
            return True

    try:
        n = int(input())
        matrix = [list(map(int, input().split())) for _ in range(n)]
        uf = UnionFind(n)
        edges = sorted((matrix[i][j], i, j) for i in range(n) for j in range(i + 1, n))
        weight = sum(w for w, i, j in edges if uf.union(i, j))
        print(weight)
    except (EOFError, ValueError) as exc:
        print("error:", exc, file=sys.stderr)
    """,
    """
    from typing import List, Optional

    class TreeNode:
        def __init__(self, val=0, left=None, right=None):
            self.val = val
            self.left = left
            self.right = right

    class Solution:
        def maxDepth(self, root: Optional[TreeNode]) -> int:
            if root is None:
                return 0
            return 1 + max(self.maxDepth(root.left), self.maxDepth(root.right))

        def merge(self, intervals: List[List[int]]) -> List[List[int]]:
            intervals.sort(key=lambda interval: interval[0])
            merged = []
            for start, end in intervals:
                if merged and start <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            return merged

        def isPalindrome(self, text: str) -> bool:
            cleaned = [ch.lower() for ch in text if ch.isalnum()]
            return cleaned == cleaned[::-1]
    """,
]

_ENGLISH = """
You are a helpful and safe Python programming assistant. Your code runs on a read-only file
system with limited memory and time. Read the problem statement carefully, reason step by step,
and then write one complete Python program in a single fenced code block. The program reads from
standard input and writes to standard output.
The program failed a public test. Input, your output and the expected output are shown below.
Analyse the feedback, trace the faulty code, say which lines you change, and write the whole
fixed program again. All public tests passed; look for edge cases the hidden tests may catch.
No code block was found in your answer. Wait, there is a mistake: the loop should stop earlier.
However, the answer is wrong when the list is empty, so we verify the boundary and retry.
Given an array of integers, return the number of pairs whose sum is even. The first line holds
the number of test cases. Each test case consists of a single string of lowercase letters.
Example 1: Input: 3 1 2 3 Output: 2. Explanation: the pairs are counted once.
Traceback (most recent call last): File "main.py", line 7, in <module> ValueError: invalid literal
The quick brown fox jumps over the lazy dog while the compiler checks every statement.
A string is a palindrome when it reads the same forwards and backwards after removing spaces.
Print the minimum number of operations required, or minus one if it is impossible to do so.
Constraints: all values in the input are integers, and the answer fits in a signed integer.
Note that the graph may contain multiple edges and self loops; vertices are numbered from one.
Hint: sorting the queries by their right endpoint allows a sweep with a binary indexed tree.
The judge compares your output token by token, ignoring trailing whitespace on each line.
Let us think about the complexity: each element is pushed and popped at most once.
Therefore the total running time is linear, which is fast enough for the given limits.
Observe that the recursion depth can reach the length of the array, which may overflow the stack.
Because of that we rewrite the search iteratively with an explicit stack of pending states.
Good programs are clear, correct and efficient; they handle empty input and very large numbers.
Remember to flush the output, close files you open, and avoid global mutable state in helpers.
The assistant explains the idea first, then shows the full code, then checks it on the examples.
Runtime error: the program raised an exception. Time limit exceeded on test four. Wrong answer.
Memory limit exceeded: the program allocated too much memory. Output limit exceeded as well.
Expected output differs from the program's output at line two: expected seven, found eight.
"""


def builtin_corpus() -> list[str]:
    """The built-in training text (fixed, so the tokenizer is the same on every machine)."""
    lines = [textwrap.dedent(p).strip() + "\n" for p in _PROGRAMS]
    lines += [line.strip() for line in _ENGLISH.strip().splitlines()]
    lines += ["```python\n" + textwrap.dedent(_PROGRAMS[0]).strip() + "\n```"]
    return lines


def build_tokenizer(vocab_size: int = 1024, corpus: list[str] | None = None):
    """A byte-level BPE `PreTrainedTokenizerFast` with ChatML special tokens and chat template."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # Qwen2's normalizer and pre-tokenizer: AutoTokenizer reloads the files as a Qwen2Tokenizer,
    # which installs these, so training with them keeps the saved and reloaded tokenizers equal.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus if corpus is not None else builtin_corpus(), trainer=trainer)
    tok.add_tokens(THINK_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def tiny_config(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int = 4096,
    **kwargs,
):
    """The Qwen2 config of a tiny model's shape (untied embeddings, as `build_tiny_model`
    builds it); `kwargs` go to Qwen2Config."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        **kwargs,
    )


def build_tiny_model(
    path: str | Path,
    seed: int = 0,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    eos_logit: float = 2.5,
    corpus: list[str] | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    save_weights: bool = True,
    pad_vocab_to: int | None = None,
) -> Path:
    """Build the tiny chat model into `path` (created; existing files are overwritten).

    Random weights alone would almost never end a turn (1 chance in ~1000 per token), so the
    model is given a taste for `<|im_end|>`: every input embedding shares one direction d, and the
    (untied) output row of `<|im_end|>` points along d, which gives the end of turn a logit of
    about `eos_logit` at every position while the other logits stay near 0. With 2.5 a turn ends
    with about 6% chance per token at temperature 0.6 (1% at 1.0): completions of a few dozen
    tokens, some cut by `max_new_tokens`, as a real model's. 0 leaves the weights as initialised.

    Large shapes (benchmarks of 7-8B models): `device="cuda"` initialises the weights on the GPU
    and `dtype="bfloat16"` saves them in half the bytes; `save_weights=False` writes the config,
    generation config and tokenizer only, for vLLM's `load_format="dummy"` (random weights made
    by vLLM itself; no end-of-turn taste then). `pad_vocab_to` grows the vocabulary to a real
    model's (Qwen3: 151,936) with placeholder tokens `<|v123|>` that decode to text, so the
    logits (and their memory) have a real model's width and every sampled id decodes.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=vocab_size, corpus=corpus)
    if pad_vocab_to is not None and pad_vocab_to > len(tokenizer):
        tokenizer.add_tokens([f"<|v{i}|>" for i in range(len(tokenizer), pad_vocab_to)])
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = tiny_config(
        len(tokenizer),
        hidden_size,
        num_layers,
        num_heads,
        num_kv_heads,
        intermediate_size,
        max_position_embeddings,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype=dtype,
    )
    generation = GenerationConfig(
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
    )
    if not save_weights:
        config.save_pretrained(path)
        generation.save_pretrained(path)
        tokenizer.save_pretrained(path)
        return _mark(path, seed)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        if eos_logit:
            with torch.no_grad():
                direction = torch.randn(hidden_size)
                direction /= direction.norm()
                model.model.embed_tokens.weight += direction  # shared component, norm 1
                # the final RMSNorm scales the (mostly shared) hidden state to norm sqrt(hidden)
                model.lm_head.weight[eos_id] = direction * (eos_logit / hidden_size**0.5)
    model.generation_config = generation
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    if str(device).startswith("cuda"):
        # hand the weights' memory back: the caller's next step (a training process launched
        # beside it, vLLM) plans from the GPU's free memory; the caching allocator would keep
        # the 16 GB of an 8B shape reserved in this process
        torch.cuda.empty_cache()
    return _mark(path, seed)


def _mark(path: Path, seed: int) -> Path:
    (path / "tiny_model.json").write_text(
        json.dumps({"builder": "engines.tiny.build_tiny_model", "seed": seed}, indent=1) + "\n"
    )
    return path

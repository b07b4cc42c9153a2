"""Multi-turn rollouts: a policy acting in the SWE tool environment, a batch of episodes at a time.

Each turn, every unfinished episode's text so far (prompt, actions, observations) goes through the model, which
writes actions until the end of an action line: training and sealed evaluation keep each episode's keys and
values from one turn to the next (`CachedActor`), the warm-up's evaluation calls `generate` on the whole text.
The actions are applied, the pending `test` actions
of the turn run together in the program sandbox, and each observation is appended. What the policy wrote is
marked 1 in `env_mask`, what the environment wrote 0, so observations are masked out of the loss (TRL's
`rollout_func` contract: prompt_ids, completion_ids, logprobs, env_mask).

An episode ends on `submit` (the environment then appends `<eos>`), when the turn budget is spent, or when
the context window is full; an action that runs past `max_action_tokens` is refused with an error observation.
Greedy decoding with fixed batching is deterministic, so sealed evaluation of one checkpoint repeats exactly.
This module is part of the SWE scorer's fingerprint (`domains/swe.py`): sealed evaluation plays its episodes. What only
training reads (scripted episodes, the `episode` column of the rewards) is in `swe_scripts.py`, outside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from evotrainer.trainer import swe_env
from evotrainer.trainer.swe_env import EnvConfig, Episode

RESERVE = len("\n" + swe_env.END_CONTEXT) + 1  # room kept free to close an episode that hits the context limit
CACHE_BYTES = 4 << 30  # the most keys and values `CachedActor` keeps at once; a larger set of episodes goes uncached


@dataclass
class Rollout:
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]  # 1: written by the policy, 0: by the environment
    logprobs: list[float]  # sampling log-probability of each completion token (0 for environment tokens)
    text: str  # the completion: actions and observations
    episode: Episode


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def model_policy(model, tokenizer, *, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = 0,
                 batch_size: int = 128, keep_cache: bool = False):
    """The acting function of `run_episodes` for a causal LM: greedy when temperature is 0. `seed` None leaves
    torch's generator alone (training: the trainer owns it, and reseeding each step would repeat the samples).
    `keep_cache` keeps each episode's keys and values from one turn to the next (`CachedActor`), so a turn computes
    only what was added since the last one; without it every turn runs the whole text again through `generate`
    (the warm-up's own evaluation keeps that path, so that the policy it ships is rebuilt as it was)."""
    import torch

    if seed is not None:
        torch.manual_seed(seed)
    stop = (encode(tokenizer, "\n")[-1], tokenizer.eos_token_id)
    if keep_cache:
        return CachedActor(model, tokenizer, temperature, top_p, stop, batch_size)

    def act(contexts: list[list[int]], max_new: int, turn: int, which: list[int]):
        return _generate(model, tokenizer, contexts, max_new, temperature, top_p, stop, batch_size)
    return act


def run_episodes(act, tokenizer, rows: list[dict], config: EnvConfig, *,
                 runner=swe_env.sandbox_runner) -> list[Rollout]:
    """Play one episode per row (`prompt`, `files` and `tests` as JSON, `history`) under `config`; `act` writes
    the actions (`model_policy`, or `swe_scripts.script_policy`)."""
    newline, eos = encode(tokenizer, "\n")[-1], tokenizer.eos_token_id
    eps = [Episode(json.loads(r["files"]), json.loads(r["tests"]), r.get("history", ""), config) for r in rows]
    outs = [Rollout(encode(tokenizer, r["prompt"]), [], [], [], "", e) for r, e in zip(rows, eps)]

    def emit(i: int, text: str, ids: list[int] | None = None, logps: list[float] | None = None, env: bool = True):
        ids = encode(tokenizer, text) if ids is None else ids
        o = outs[i]
        o.completion_ids += ids
        o.env_mask += [0 if env else 1] * len(ids)
        o.logprobs += logps if logps is not None else [0.0] * len(ids)
        o.text += text

    def room(i: int) -> int:
        return config.max_context - RESERVE - len(outs[i].prompt_ids) - len(outs[i].completion_ids)

    def close(i: int, end: str, marker: str) -> None:
        eps[i].done, eps[i].end = True, end
        emit(i, "\n" + marker)

    for turn in range(config.max_turns):
        active = [i for i, e in enumerate(eps) if not e.done]
        for i in [i for i in active if room(i) <= 0]:
            close(i, "context", swe_env.END_CONTEXT)
        active = [i for i in active if not eps[i].done]
        if not active:
            break
        budget = min(config.max_action_tokens, max(room(i) for i in active))  # never past the context window
        actions = act([outs[i].prompt_ids + outs[i].completion_ids for i in active], budget, turn, active)
        pending: list[int] = []
        observations: dict[int, str] = {}
        for i, (ids, logps) in zip(active, actions):
            logps = [0.0] * len(ids) if logps is None else logps
            space = room(i)
            ids, logps = ids[:config.max_action_tokens][:space], logps[:config.max_action_tokens][:space]
            stopped = bool(ids) and ids[-1] in (newline, eos)
            line = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=True)
            emit(i, line + ("\n" if stopped and ids[-1] == newline else ""), ids, logps, env=False)
            if not stopped and len(ids) == space < config.max_action_tokens:  # cut by the context: never run
                close(i, "context", swe_env.END_CONTEXT)
                continue
            if not stopped or ids[-1] == eos:
                emit(i, "\n")  # keep the text one action per line
            if not stopped:
                tool, arg = swe_env.split_action(line)
                eps[i].actions.append([tool if tool in swe_env.TOOLS else "?", arg, True])
                observations[i] = f"error: action longer than {config.max_action_tokens} tokens"
                continue
            obs, run = eps[i].step(line)
            observations[i] = obs
            if run == "test":
                pending.append(i)
        if pending:
            got = runner([(eps[i].files, [t[:3] for t in eps[i].tests]) for i in pending])
            for i, g in zip(pending, got):
                observations[i] = eps[i].test_result(g)
        for i, obs in observations.items():
            if eps[i].done:  # submitted
                emit(i, obs)
                outs[i].completion_ids.append(eos)
                outs[i].env_mask.append(0)
                outs[i].logprobs.append(0.0)
                continue
            ids = encode(tokenizer, obs)
            if len(ids) > room(i):  # the observation does not fit: show what fits, then stop
                emit(i, tokenizer.decode(ids[:max(room(i), 0)], skip_special_tokens=True))
                close(i, "context", swe_env.END_CONTEXT)
            elif turn == config.max_turns - 1:
                emit(i, obs, ids)
                close(i, "turn_limit", swe_env.END_TURNS)
            else:
                emit(i, obs + swe_env.TURN)
    return outs


def _generate(model, tokenizer, contexts: list[list[int]], max_new: int, temperature: float, top_p: float,
              stop: tuple[int, int], batch_size: int) -> list[tuple[list[int], list[float]]]:
    """One action per context: the new tokens up to and including the first stop token, with their sampling
    log-probabilities (under the temperature-scaled distribution, as TRL computes them)."""
    import torch

    out: list[tuple[list[int], list[float]]] = []
    pad = tokenizer.pad_token_id
    with torch.inference_mode():
        for b in range(0, len(contexts), batch_size):
            chunk = contexts[b:b + batch_size]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])
            mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])
            kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=top_p) if temperature > 0 else \
                dict(do_sample=False)
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=pad,
                                 eos_token_id=list(stop), output_scores=True, return_dict_in_generate=True, **kwargs)
            new = gen.sequences[:, width:]
            logp = torch.stack([torch.log_softmax(s.float(), -1) for s in gen.scores], 1)
            chosen = logp.gather(2, new.unsqueeze(-1)).squeeze(-1).tolist()
            for toks, lps in zip(new.tolist(), chosen):
                end = next((t + 1 for t, tok in enumerate(toks) if tok in stop), len(toks))
                out.append((toks[:end], lps[:end]))
    return out


class CachedActor:
    """`model_policy`'s acting function with each episode's keys and values kept between turns.

    Without it, a turn's `generate` runs every episode's whole text through the model again: in a training run of
    the SWE policy that prefill was half of generation's time (py-spy, 2026-12-07), and a batch of 32 training
    episodes plays in 0.43x the time with the cache (`python benchmarks/bench_rollouts.py`, beside two training
    processes), its layers appending in place (`_GrowingLayer`).

    The episodes of a batch (at most `batch_size`, fixed at turn 0) share one cache. Each turn appends what is new
    in each episode (the last action's final token, the observation), left-padded to a common width, then the
    tokens each episode samples. A padding token stays in the cache masked out until the next turn moves each
    episode's tokens together (`compact`), where a token the caller did not keep of what was sampled is dropped; a
    token's position counts only the tokens kept before it. So the model sees each episode's text exactly as a
    fresh `generate` would, up to the order of floating-point sums. Sampling is HF's: the logits divided by the
    temperature, top-p filtered, `torch.multinomial` on their softmax; the log-probabilities are those of that
    distribution. A finished episode's row leaves the cache.

    Every batch's cache lives until its episodes end: a set of episodes whose caches could outgrow `CACHE_BYTES`
    (episodes x the model's positions x its keys and values a token) is played as without the cache."""

    def __init__(self, model, tokenizer, temperature: float, top_p: float, stop: tuple[int, int], batch_size: int):
        self.model, self.tokenizer, self.temperature, self.top_p = model, tokenizer, temperature, top_p
        self.pad, self.stop, self.batch_size = tokenizer.pad_token_id, stop, batch_size
        self.batches: list[_CacheBatch] = []
        self.episodes: set[int] = set()
        self.cached = True

    def __call__(self, contexts: list[list[int]], max_new: int, turn: int, which: list[int]):
        import torch

        if turn == 0 or not set(which) <= self.episodes:  # a new set of episodes
            self.episodes, self.cached = set(which), len(which) * kv_bytes(self.model) <= CACHE_BYTES
            self.batches = [_CacheBatch(which[b:b + self.batch_size])
                            for b in range(0, len(which), self.batch_size)] if self.cached else []
        if not self.cached:
            return _generate(self.model, self.tokenizer, contexts, max_new, self.temperature, self.top_p, self.stop,
                             self.batch_size)
        text = dict(zip(which, contexts))
        out: dict[int, tuple[list[int], list[float]]] = {}
        with torch.inference_mode():
            for batch in self.batches:
                batch.keep([i for i in batch.rows if i in text])
                if batch.rows:
                    out.update(zip(batch.rows, batch.act(self, [text[i] for i in batch.rows], max_new)))
        self.batches = [b for b in self.batches if b.rows]
        return [out[i] for i in which]

    def _logits(self, batch: _CacheBatch, ids, mask, positions):
        if batch.cache is None:
            batch.cache = _growing_cache()
        res = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=batch.cache,
                         use_cache=True, logits_to_keep=1)
        batch.cache = res.cache
        return res.logits[:, -1, :].float()

    def scores(self, logits):
        """The logits as `generate` samples from them: divided by the temperature, then top-p filtered (HF's
        TopPLogitsWarper: the least likely tokens whose mass is at most 1 - top_p go, the likeliest stays)."""
        import torch

        if self.temperature <= 0:
            return logits
        scores = logits / self.temperature
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            tail = ordered.softmax(-1).cumsum(-1) <= 1 - self.top_p
            tail[:, -1] = False
            scores = scores.masked_fill(tail.scatter(1, order, tail), float("-inf"))
        return scores

    def _choose(self, logits):
        """The next token of each row and its log-probability under the distribution it was drawn from."""
        import torch

        logp = torch.log_softmax(self.scores(logits), -1)
        tok = logp.argmax(-1) if self.temperature <= 0 else torch.multinomial(logp.exp(), 1)[:, 0]
        return tok, logp.gather(1, tok[:, None])[:, 0]


def kv_bytes(model) -> int:
    """The bytes of keys and values one episode may hold in `model`'s cache: all its positions, plus the slack a
    `_GrowingLayer` buffer keeps."""
    cfg = model.config.get_text_config()
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    size = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * heads * head_dim * size * (cfg.max_position_embeddings + GROWTH)


GROWTH = 64  # columns a `_GrowingLayer` buffer grows by


def _growing_cache():
    """A cache whose layers append in place (`_GrowingLayer`)."""
    from transformers.cache_utils import Cache, DynamicLayer

    class _GrowingLayer(DynamicLayer):
        """`DynamicLayer` with its keys and values kept as views of buffers grown `GROWTH` columns at a time:
        `DynamicLayer` appends by `cat`, a copy of the whole cache at every step (a third of the rollouts' time,
        measured)."""

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, k = (self.keys.shape[-2] if self.keys.dim() == 4 else 0), key_states.shape[-2]
            buf = getattr(self, "buffers", None)
            # a selection of rows or a compaction replaced the keys with a tensor of their own: new buffers
            if buf is None or n + k > buf[0].shape[-2] or (n and self.keys.data_ptr() != buf[0].data_ptr()) \
                    or buf[0].shape[0] != key_states.shape[0]:
                shape = (*key_states.shape[:2], n + k + GROWTH, key_states.shape[-1])
                buf = (key_states.new_empty(shape), value_states.new_empty(shape))
                if n:
                    buf[0][..., :n, :], buf[1][..., :n, :] = self.keys, self.values
                self.buffers = buf
            buf[0][..., n:n + k, :], buf[1][..., n:n + k, :] = key_states, value_states
            self.keys, self.values = buf[0][..., :n + k, :], buf[1][..., :n + k, :]
            return self.keys, self.values

    return Cache(layer_class_to_replicate=_GrowingLayer)


class _CacheBatch:
    """One batch of `CachedActor`: its episodes (`rows`), the cache, the mask over the cache's columns, and for each
    row the tokens it kept (`kept`) with their columns (`cols`)."""

    def __init__(self, rows: list[int]):
        self.rows = list(rows)
        self.cache = None
        self.mask = None  # [rows, columns] long
        self.kept: list[list[int]] = [[] for _ in rows]
        self.cols: list[list[int]] = [[] for _ in rows]

    def keep(self, rows: list[int]) -> None:
        if rows == self.rows:
            return
        import torch

        idx = [self.rows.index(i) for i in rows]
        if self.cache is not None and idx:
            self.cache.batch_select_indices(torch.tensor(idx))
            self.mask = self.mask[idx]
        self.rows, self.kept, self.cols = rows, [self.kept[k] for k in idx], [self.cols[k] for k in idx]

    def compact(self) -> None:
        """Each row's kept columns moved together at the right of a cache as wide as the longest row, left-padded:
        the holes a turn leaves (the padding of its new text, the steps after an episode's action ended) would
        otherwise widen every later step, and a step copies the whole cache (`DynamicCache` appends by `cat`)."""
        import torch

        width = max(map(len, self.kept))
        if self.mask.shape[1] == width and all(c == list(range(width - len(c), width)) for c in self.cols):
            return
        idx = torch.tensor([[0] * (width - len(c)) + c for c in self.cols])  # a pad slot copies column 0, masked
        for layer in self.cache.layers:
            at = idx[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, at), layer.values.gather(2, at)
        self.mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in self.cols])
        self.cols = [list(range(width - len(c), width)) for c in self.cols]

    def act(self, actor: CachedActor, texts: list[list[int]], max_new: int) -> list[tuple[list[int], list[float]]]:
        import torch

        new: list[list[int]] = []
        for r, text in enumerate(texts):
            same = 0  # the kept tokens that are still the episode's text; `compact` drops the rest
            for a, b in zip(self.kept[r], text):
                if a != b:
                    break
                same += 1
            same = min(same, len(text) - 1)  # the last token is always computed again: its logits are the next step's
            self.kept[r], self.cols[r] = self.kept[r][:same], self.cols[r][:same]
            new.append(text[same:])
        if self.cache is not None:
            self.compact()
        width = 0 if self.mask is None else self.mask.shape[1]
        span = max(map(len, new))
        ids = torch.tensor([[actor.pad] * (span - len(n)) + n for n in new])
        block = torch.tensor([[0] * (span - len(n)) + [1] * len(n) for n in new])
        positions = torch.tensor([[0] * (span - len(n)) + list(range(len(k), len(k) + len(n)))
                                  for n, k in zip(new, self.kept)])
        for r, n in enumerate(new):
            self.kept[r] += n
            self.cols[r] += range(width + span - len(n), width + span)
        self.mask = block if self.mask is None else torch.cat([self.mask, block], 1)
        logits = actor._logits(self, ids, self.mask, positions)
        rows = len(texts)
        toks: list[list[int]] = [[] for _ in range(rows)]
        logps: list[list[float]] = [[] for _ in range(rows)]
        running = torch.ones(rows, dtype=torch.bool)
        stop = torch.tensor(actor.stop)
        for step in range(max_new):
            tok, logp = actor._choose(logits)
            for r in running.nonzero()[:, 0].tolist():
                toks[r].append(int(tok[r]))
                logps[r].append(float(logp[r]))
            fed = running.clone()  # this step's tokens of the rows still acting go into the cache
            running &= ~torch.isin(tok, stop)
            if step == max_new - 1 or not running.any():
                break  # the last tokens are fed with the next turn's text
            width = self.mask.shape[1]
            ids = torch.where(fed, tok, torch.full_like(tok, actor.pad))[:, None]
            positions = torch.tensor([[len(k)] for k in self.kept])
            for r in fed.nonzero()[:, 0].tolist():
                self.kept[r].append(toks[r][-1])
                self.cols[r].append(width)
            self.mask = torch.cat([self.mask, fed.long()[:, None]], 1)
            logits = actor._logits(self, ids, self.mask, positions)
        return list(zip(toks, logps))


def play(model, tokenizer, tasks: list, config: EnvConfig, *, temperature: float = 0.0, seed: int = 0,
         batch_size: int = 128, keep_cache: bool = False) -> list[str]:
    """The completion text of one episode per task (evaluation: the sealed scorer grades these)."""
    rows = [{"prompt": t.prompt, **dict(t.columns)} for t in tasks]
    act = model_policy(model, tokenizer, temperature=temperature, seed=seed, batch_size=batch_size,
                       keep_cache=keep_cache)
    return [o.text for o in run_episodes(act, tokenizer, rows, config)]

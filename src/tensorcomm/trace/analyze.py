"""``tensorcomm trace analyze``: read every rank's flight record and say what went wrong.

The records are the ``rank<R>.json`` files ``recorder.dump`` writes. For each group the ranks'
calls are lined up by sequence number (step), and the analysis looks for, in this order:

- the first step at which members made different calls (a skipped or an extra call): the ranks
  that differ from a strict majority diverged; with no majority, the rank whose call (or call
  site, where every call has one) does not follow its previous one as in its earlier steps
  diverged (a loop that skipped a call);
- ranks that never reached the step where another member failed, reached it only after that
  member had given up on them, were still inside it (or an earlier step) when they wrote a
  record later (SIGUSR1 after SIGCONT), or were inside it when a member timed out there without
  timing out themselves: stopped, hung, or slow; and ranks that left no record at all (they did
  not fail themselves: stopped or killed before they could write it);
- the first failure in time.

``analyze(directory)`` returns the findings as one paragraph.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..rendezvous import private

RECORD = re.compile(r"rank(\d+)\.json$")


@dataclass
class Findings:
    """What ``find`` makes of a set of flight records (``paragraph`` says it in words)."""

    world_size: int
    recorded: list[int]
    missing: list[int]
    diverged: list[int] = field(default_factory=list)  # ranks whose call differs at ``divergence``
    divergence: str | None = None  # the sentence that describes it
    behind: list[int] = field(default_factory=list)  # ranks the others waited for
    behind_text: list[str] = field(default_factory=list)
    first_failure: str | None = None

    def paragraph(self) -> str:
        """The findings as one paragraph."""
        parts = [f"{len(self.recorded)} of {self.world_size} ranks left a flight record"
                 + (f" ({_names(self.recorded)})." if self.recorded else ".")]
        if self.divergence:
            parts.append(self.divergence)
        parts += self.behind_text
        if self.missing:
            parts.append(f"{_names(self.missing).capitalize()} left no record: "
                         f"{'it' if len(self.missing) == 1 else 'they'} did not fail a call, so "
                         "stopped, hung or was killed (SIGUSR1 makes a live rank write its record).")
        if self.first_failure:
            parts.append(self.first_failure)
        if not (self.divergence or self.behind_text or self.missing or self.first_failure):
            parts.append("No call failed and every rank reached the same step on every group.")
        return " ".join(parts)


def _names(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def load(directory: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Every ``rank<R>.json`` flight record in ``directory``, by rank.

    Raises:
        FileNotFoundError: the directory holds no record.
        private.Untrusted: the directory or a record is a link, or another user owns it or may
            write to it (a planted record would blame the wrong rank).
    """
    records = {}
    shown = os.fspath(directory)
    dir_fd = private.trusted_dir(shown, what="flight record directory")
    try:
        for name in sorted(os.listdir(dir_fd)):
            match = RECORD.match(name)
            if match:
                text = private.read_trusted(name, "flight record", dir_fd, os.path.join(shown, name))
                records[int(match.group(1))] = json.loads(text)
    finally:
        os.close(dir_fd)
    if not records:
        raise FileNotFoundError(f"no flight record (rank<R>.json) in {os.fspath(directory)}")
    return records


def _site(call: Mapping[str, Any]) -> str:
    site = call.get("site")
    if not site:
        return "an unknown place"
    path, _, rest = site.partition(":")
    return f"{os.path.basename(path)}:{rest.split(' ', 1)[0]}"


def _steps(calls: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    return {call["seq"]: call for call in calls if call.get("seq") is not None}


def _follows_habit(steps: Mapping[int, Mapping[str, Any]], seq: int) -> bool:
    """Whether the call at ``seq`` follows the one before it as such a pair did earlier: pairs of
    call sites where every call has one (``recorder.configure(sites=True)``), else of calls."""
    before = steps.get(seq - 1)
    if before is None:
        return True
    key = _site if all(call.get("site") for call in steps.values()) else _call
    pair = (key(before), key(steps[seq]))
    return any(steps.get(s - 1) is not None and (key(steps[s - 1]), key(steps[s])) == pair
               for s in steps if s < seq)


def _call(call: Mapping[str, Any]) -> str:
    return str(call["call"])


def find(records: Mapping[int, Mapping[str, Any]]) -> Findings:
    """Analyse flight records by rank (``load``'s result)."""
    world_size = max([r.get("world_size") or 0 for r in records.values()] + [max(records) + 1])
    findings = Findings(world_size, sorted(records), [r for r in range(world_size) if r not in records])
    groups: dict[tuple[str, tuple[int, ...]], dict[int, list[Mapping[str, Any]]]] = {}
    for rank, record in records.items():
        for call in record.get("calls", []):
            key = (call["group"], tuple(call["ranks"]))
            groups.setdefault(key, {}).setdefault(rank, []).append(call)
    failures = sorted((call["ended_ns"] or 0, rank, call) for rank, record in records.items()
                      for call in record.get("calls", []) if call["state"] == "failed")
    for (group, members), by_rank in sorted(groups.items()):
        steps = {rank: _steps(calls) for rank, calls in by_rank.items()}
        if findings.divergence is None:
            _divergence(findings, group, steps)
        _behind(findings, group, members, steps, records)
    if failures:
        _, rank, call = failures[0]
        findings.first_failure = (
            f"The first call to fail was rank {rank}'s {call['call']} at step {call['seq']} of "
            f"group '{call['group']}' ({_site(call)}): {call['error']}")
    return findings


def _divergence(findings: Findings, group: str, steps: Mapping[int, Mapping[int, Mapping[str, Any]]]) -> None:
    common = sorted(set().union(*(s.keys() for s in steps.values())))
    for seq in common:
        made = {rank: s[seq] for rank, s in steps.items() if seq in s}
        if len(made) < 2 or len({call["call"] for call in made.values()}) == 1:
            continue
        counts = Counter(call["call"] for call in made.values())
        top, n = counts.most_common(1)[0]
        if n * 2 > len(made):
            odd = [rank for rank, call in made.items() if call["call"] != top]
        else:
            odd = [rank for rank in made if not _follows_habit(steps[rank], seq)]
            if len(odd) == len(made):
                odd = []
        usual = [rank for rank in made if rank not in odd]
        if odd:
            differ = "; ".join(f"{_names([r])} called {made[r]['call']} at {_site(made[r])}" for r in odd)
            rest = made[usual[0]]
            findings.diverged = odd
            findings.divergence = (
                f"The calls diverged at step {seq} of group '{group}': {differ}, where "
                f"{_names(usual)} called {rest['call']} at {_site(rest)}, so {_names(odd)} skipped "
                f"or added a call before that step.")
        else:
            calls = "; ".join(f"{_names([r])} called {c['call']} at {_site(c)}" for r, c in made.items())
            findings.divergence = f"The calls diverged at step {seq} of group '{group}': {calls}."
        return


def _behind(findings: Findings, group: str, members: Sequence[int],
            steps: Mapping[int, Mapping[int, Mapping[str, Any]]],
            records: Mapping[int, Mapping[str, Any]]) -> None:
    failed = [(call["ended_ns"] or 0, seq, rank) for rank, s in steps.items()
              for seq, call in s.items() if call["state"] == "failed"]
    if not failed:
        return
    given_up, seq, who = min(failed)  # the first member to fail on this group
    timed_out = _timed_out(steps[who][seq])
    for rank in members:
        if rank not in records or rank in findings.behind or rank in findings.diverged:
            continue
        mine = steps.get(rank, {})
        call = mine.get(seq)
        last = max(mine) if mine else None
        where = (f"its last call there was step {last}, {mine[last]['call']} at {_site(mine[last])} "
                 f"({mine[last]['state']})" if last is not None else "it had made no call there")
        stuck = [(dump, c) for dump in records[rank].get("dumps", []) if dump["time_ns"] > given_up
                 for c in dump.get("in_flight", []) if c["group"] == group
                 and tuple(c["ranks"]) == tuple(members) and c["seq"] is not None and c["seq"] <= seq]
        if stuck:
            dump, inside = stuck[0]
            text = (f"was still inside step {inside['seq']} of group '{group}' ({inside['call']}) when "
                    f"it wrote its record ({dump['reason']}) {(dump['time_ns'] - given_up) / 1e9:.1f} s "
                    f"after rank {who} had given up waiting at step {seq} (it was stopped or hung "
                    "inside that call)")
        elif call is None:
            text = f"never reached step {seq} of group '{group}' where rank {who} failed: {where}"
        elif call["started_ns"] is not None and call["started_ns"] > given_up:
            text = (f"started step {seq} of group '{group}' ({call['call']} at {_site(call)}) only "
                    f"{(call['started_ns'] - given_up) / 1e9:.1f} s after rank {who} had given up "
                    "on it (it was stopped or slow before that call)")
        elif timed_out and not _timed_out(call) and (call["ended_ns"] or given_up + 1) > given_up:
            text = (f"was inside step {seq} of group '{group}' ({call['call']} at {_site(call)}) when "
                    f"rank {who} gave up waiting for it, and did not time out itself (it was stopped, "
                    "hung or slow inside that call)")
        else:
            continue
        findings.behind.append(rank)
        findings.behind_text.append(f"{_names([rank]).capitalize()} {text}.")
    for rank in members:  # members that left no record were waited for too
        if rank not in records and rank not in findings.behind:
            findings.behind.append(rank)


def _timed_out(call: Mapping[str, Any]) -> bool:
    return call["state"] == "failed" and str(call.get("error")).startswith("CommTimeoutError")


def analyze(directory: str | os.PathLike[str]) -> str:
    """The findings about the flight records in ``directory``, as one paragraph."""
    return find(load(directory)).paragraph()

"""StopMatcher: the streaming Aho-Corasick matcher agrees with a brute-force reference on any chunking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.stop import StopAutomaton, StopMatcher


def reference(text: str, stops: list[str]) -> tuple[str, bool]:
    """Brute force: the first end position of any stop string; cut at the longest one ending there."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            return text[: end - max(map(len, ending))], True
    return text, False


def feed(stops: list[str], chunks: list[str]) -> tuple[str, bool, list[str]]:
    return feed_into(StopMatcher(stops), chunks)


alphabet = st.sampled_from("abc")


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.text(alphabet, min_size=1, max_size=5), max_size=5),
    st.lists(st.text(alphabet, max_size=6), max_size=8),
)
def test_matches_reference_on_any_chunking(stops: list[str], chunks: list[str]) -> None:
    text, stopped, released = feed(stops, chunks)
    want_text, want_stopped = reference("".join(chunks), stops)
    assert (text, stopped) == (want_text, want_stopped)
    # Released text is never taken back: every piece is a prefix of the final answer.
    assert want_text.startswith("".join(released))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=1, max_size=5),
    st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=8),
)
def test_holds_back_exactly_a_possible_match(stops: list[str], chunks: list[str]) -> None:
    matcher = StopMatcher(stops)
    for chunk in chunks:
        _, stopped = matcher.push(chunk)
        if stopped:
            return
        held = matcher.text[matcher.emitted :]
        longest = max(
            (
                n
                for n in range(len(matcher.text) + 1)
                if any(s.startswith(matcher.text[len(matcher.text) - n :]) and n < len(s) for s in stops)
            ),
            default=0,
        )
        assert len(held) == longest


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=1, max_size=5),
    st.lists(st.text(alphabet, max_size=4), min_size=1, max_size=8),
    st.integers(min_value=0, max_value=8),
)
def test_a_split_stream_with_its_held_text_handed_on_matches_one_stream(
    stops: list[str], chunks: list[str], cut: int
) -> None:
    """Prefill and decode apart (engine/serving/disagg.py): the first part releases what it may and hands its held
    text on; the second starts from it. Together they release what one matcher over the whole text does."""
    first = StopMatcher(stops)
    released = []
    for chunk in chunks[:cut]:
        out, stopped = first.push(chunk)
        released.append(out)
        if stopped:
            break
    else:
        second = StopMatcher(stops)
        second.hold(first.held)
        _, stopped, rest = feed_into(second, chunks[cut:])
        released += rest
    assert ("".join(released), stopped) == feed(stops, chunks)[:2]


def feed_into(matcher: StopMatcher, chunks: list[str]) -> tuple[str, bool, list[str]]:
    released: list[str] = []
    stopped = False
    for chunk in chunks:
        out, stopped = matcher.push(chunk)
        released.append(out)
        if stopped:
            break
    if not stopped:
        released.append(matcher.flush())
    return "".join(released), stopped, released


class CountingAutomaton(StopAutomaton):
    """The same automaton, counting character steps and failure-link hops (the whole work of matching)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        super().__init__(stops)
        self.work = 0

    def step(self, state: int, ch: str) -> int:
        self.work += 1
        while state and ch not in self.goto[state]:
            state = self.fail[state]
            self.work += 1
        return self.goto[state].get(ch, 0)


def test_work_per_token_does_not_grow_with_the_number_of_stops() -> None:
    """Counted in automaton work, not seconds: 20,000 stop strings cost what 2 do per pushed token."""
    work = []
    for stops in (["zq0", "zq1"], [f"zq{i:05d}" for i in range(20_000)]):
        matcher = StopMatcher(stops)
        ac = matcher._ac = CountingAutomaton(tuple(stops))
        for _ in range(200):
            matcher.push("hello zq")  # every token walks into a partial match and out again
        work.append(ac.work)
    assert work[0] == work[1] <= 2 * 200 * len("hello zq")

"""The GIL is released during forwards, and Ctrl-C (SIGINT) interrupts a long
call with KeyboardInterrupt, leaving the model usable."""

import os
import signal
import threading
import time

import pytest

import loom
from conftest import STORIES, assert_same_bytes

HOOK = "blocks.4.hook_resid_post"
# Many small forwards: a call long enough to be interrupted, whose cancel
# points come often.
LONG = ["Once upon a time, there was a little girl named Lily. She liked to play."] * 800
LONG_ARGS = dict(select="mean", batch_tokens=32, commit_every=64)
TEXT = " ".join(["Once upon a time, there was a little girl named Lily."] * 200)
PPL_ARGS = dict(ctx=16, stride=2, protocol="all-tokens")


@pytest.fixture(scope="module")
def model():
    # One thread: the timings these tests take stay steady when the machine
    # is busy (OpenMP's barriers degrade badly when cores are oversubscribed).
    return loom.Model(STORIES, threads=1)


def timed(f, *args, **kw):
    start = time.monotonic()
    result = f(*args, **kw)
    return result, time.monotonic() - start


def test_gil_is_released_during_extract(model):
    ticks = [0]
    stop = threading.Event()

    def tick():  # needs the GIL briefly every millisecond
        while not stop.is_set():
            time.sleep(0.001)
            ticks[0] += 1

    t = threading.Thread(target=tick)
    t.start()
    try:
        time.sleep(0.02)
        before = ticks[0]
        _, elapsed = timed(model.extract, LONG, HOOK, **LONG_ARGS)
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
    assert elapsed > 0.05, "the long extract took only %.3f s" % elapsed
    # A thread that cannot take the GIL while extract runs would tick (almost)
    # never; sleeping 1 ms per tick, it ticks hundreds of times a second.
    assert during >= 10 and during / elapsed > 50, "%d ticks in %.2f s" % (during, elapsed)


def interrupt_after(seconds):
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_interrupts_extract_and_model_stays_usable(model):
    ref, seconds = timed(model.extract, LONG, HOOK, **LONG_ARGS)
    # Well before the end: the signal is acted on at the next forward.
    timer = interrupt_after(seconds / 10)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        model.extract(LONG, HOOK, **LONG_ARGS)
    elapsed = time.monotonic() - start
    timer.join()
    assert elapsed < seconds, "interrupted after %.2f s, the whole call takes %.2f s" % (
        elapsed, seconds)
    again = model.extract(LONG, HOOK, **LONG_ARGS)
    assert_same_bytes(again[HOOK], ref[HOOK], "after the interrupt")


def test_ctrl_c_interrupts_perplexity(model):
    full, seconds = timed(model.perplexity, TEXT, **PPL_ARGS)
    timer = interrupt_after(seconds / 10)
    with pytest.raises(KeyboardInterrupt):
        model.perplexity(TEXT, **PPL_ARGS)
    timer.join()
    again = model.perplexity(TEXT, **PPL_ARGS)
    assert again["nll_sum"] == full["nll_sum"] and again["windows"] == full["windows"]


def test_ctrl_c_interrupts_generate(model):
    args = dict(max_tokens=600, ctx=512)  # greedy runs to the full context
    full, seconds = timed(model.generate, "Once upon a time", **args)
    assert full["stop_reason"] == "context"
    timer = interrupt_after(seconds / 10)
    with pytest.raises(KeyboardInterrupt):
        model.generate("Once upon a time", **args)
    timer.join()
    assert model.generate("Once upon a time", **args) == full

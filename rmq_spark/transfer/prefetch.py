"""The source consumer's life and its prefetch changes: a pure state machine, no pika.

RabbitMQ fixes a consumer's prefetch when it consumes (basic.qos with global=false
applies to new consumers only, and quorum queues refuse a global one), so following
the byte window (`byte_window.ByteWindow`) to a new prefetch means a new consumer:
cancel, basic.qos, consume again, and the new consumer only once everything the old
one was sent is acked (the broker would not count the old one's unacked deliveries
against the new one's prefetch). The session stops consuming the same way (cancel,
then the drain's proof, `drain.DrainCheck`), and a stop can come at any step of a
change. Every step a `Consumer` sends is decided here:

    OPENING ──qos-ok and confirms on: CONSUME──► CONSUMING ◄───────────────────────┐
                                                   │ change: CANCEL                 │
                                                   ▼                                │
                                               CANCELLING                           │
                                                   │ cancel-ok: SET_PREFETCH        │
                                                   ▼                                │
                                                SETTING ──qos-ok──► WAITING ──acked,│
                                                            nothing old unacked: CONSUME

    stop (the drain's, or the transfer failed), from
      CONSUMING: CANCEL ─────────────────────► STOPPING ──cancel-ok: PROVE──► STOPPED
      CANCELLING (its cancel is the stop's) ─► STOPPING
      SETTING (its qos is out) ──────────────► STOPPING_AFTER_QOS ──qos-ok: PROVE──► STOPPED
      WAITING (nothing of ours is out): PROVE ► STOPPED
      OPENING, NO_CONSUMER: NOTHING_TO_CANCEL ► NO_CONSUMER

    STOPPED ──the proof found a message (`resume`): CONSUME──► CONSUMING
            (or SET_PREFETCH──► SETTING, when the stop took over a change before its qos)
    the broker cancelled our consumer ──► NO_CONSUMER;  the session ending ──► ENDED

Every event takes `ending` (the session is closing, or the source link is gone): then
the machine is ENDED and sends nothing more, whatever it was waiting for. A get-ok
from the drain's proof can only come in STOPPED (the get is sent after the stop's
cancel-ok), so a change is never under way when the proof resumes consuming.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    """Where the source consumer is."""

    OPENING = "opening"  # waiting for the source's qos-ok and the destination's confirms
    CONSUMING = "consuming"
    CANCELLING = "cancelling"  # a prefetch change: the old consumer's cancel is out
    SETTING = "setting"  # ...the new basic.qos is out
    WAITING = "waiting"  # ...set; the old consumer's deliveries are not all acked yet
    STOPPING = "stopping"  # the stop's cancel (or a change's, taken over) is out
    STOPPING_AFTER_QOS = "stopping after qos"  # stopped during a change's basic.qos
    STOPPED = "stopped"  # our consumer is cancelled: the drain's proof follows
    NO_CONSUMER = "no consumer"  # never consumed, or the broker cancelled it
    ENDED = "ended"  # the session is ending: nothing more is sent


class ConsumerStep(enum.Enum):
    """What the consumer sends next."""

    NOTHING = "nothing"
    CONSUME = "consume"  # basic.consume
    CANCEL = "cancel"  # basic.cancel (a change's or the stop's)
    SET_PREFETCH = "set prefetch"  # basic.qos with the byte window's granted prefetch
    PROVE = "prove"  # our consumer is gone: the drain's proof (`DrainCheck.cancel_ok`)
    NOTHING_TO_CANCEL = "nothing to cancel"  # stopping with no consumer of ours


_STOP_TAKES_OVER = {
    Phase.CANCELLING: (Phase.STOPPING, ConsumerStep.NOTHING),
    Phase.SETTING: (Phase.STOPPING_AFTER_QOS, ConsumerStep.NOTHING),
    Phase.WAITING: (Phase.STOPPED, ConsumerStep.PROVE),
    Phase.CONSUMING: (Phase.STOPPING, ConsumerStep.CANCEL),
    Phase.OPENING: (Phase.NO_CONSUMER, ConsumerStep.NOTHING_TO_CANCEL),
    Phase.NO_CONSUMER: (Phase.NO_CONSUMER, ConsumerStep.NOTHING_TO_CANCEL),
}


class ConsumerState:
    """One session's source consumer. Feed it the link's replies; send what it returns."""

    def __init__(self) -> None:
        self.phase = Phase.OPENING
        self._prefetch_set = False  # OPENING: the source's first qos-ok came
        self._confirms_on = False  # OPENING: the destination's confirm.select-ok came
        # The stop took over a change before its basic.qos was sent: the broker's
        # prefetch is not the byte window's `granted`, so a resume sets it first.
        self._stale_prefetch = False

    @property
    def consuming(self) -> bool:
        """Our consumer is on, and no change or stop is under way."""
        return self.phase is Phase.CONSUMING

    def _end(self) -> ConsumerStep:
        self.phase = Phase.ENDED
        return ConsumerStep.NOTHING

    def _opened(self) -> ConsumerStep:
        if self._prefetch_set and self._confirms_on:
            self.phase = Phase.CONSUMING
            return ConsumerStep.CONSUME
        return ConsumerStep.NOTHING

    def confirms_on(self, *, ending: bool) -> ConsumerStep:
        """The destination's publisher confirms are on."""
        if ending:
            return self._end()
        self._confirms_on = True
        return self._opened() if self.phase is Phase.OPENING else ConsumerStep.NOTHING

    def prefetch_set(self, *, idle: bool, ending: bool) -> ConsumerStep:
        """basic.qos-ok: the first prefetch, a change's new one, or a resume's."""
        if ending:
            return self._end()
        phase = self.phase
        if phase is Phase.OPENING:
            self._prefetch_set = True
            return self._opened()
        if phase is Phase.SETTING:
            self.phase = Phase.WAITING
            self._stale_prefetch = False
            return self.acked(idle=idle, ending=False)
        if phase is Phase.STOPPING_AFTER_QOS:
            self.phase = Phase.STOPPED
            return ConsumerStep.PROVE
        return ConsumerStep.NOTHING

    def change(self, *, ending: bool) -> ConsumerStep:
        """The byte window wants a new prefetch (the caller asked `consuming` first)."""
        if ending:
            return self._end()
        if self.phase is not Phase.CONSUMING:
            return ConsumerStep.NOTHING
        self.phase = Phase.CANCELLING
        return ConsumerStep.CANCEL

    def cancel_ok(self, *, ending: bool) -> ConsumerStep:
        """basic.cancel-ok: a change's (set the new prefetch) or the stop's (prove)."""
        if ending:
            return self._end()
        if self.phase is Phase.CANCELLING:
            self.phase = Phase.SETTING
            return ConsumerStep.SET_PREFETCH
        if self.phase is Phase.STOPPING:
            self.phase = Phase.STOPPED
            return ConsumerStep.PROVE
        return ConsumerStep.NOTHING

    def acked(self, *, idle: bool, ending: bool) -> ConsumerStep:
        """Acks went out: a waiting change consumes once nothing old is unacked."""
        if ending:
            return self._end()
        if self.phase is Phase.WAITING and idle:
            self.phase = Phase.CONSUMING
            return ConsumerStep.CONSUME
        return ConsumerStep.NOTHING

    def stop(self, *, ending: bool) -> ConsumerStep:
        """The session stops consuming (drained, or the transfer failed). A change under
        way is taken over: its cancel is the stop's, and the proof follows its reply."""
        if ending:
            return self._end()
        if self.phase is Phase.CANCELLING:
            self._stale_prefetch = True
        self.phase, step = _STOP_TAKES_OVER.get(self.phase, (self.phase, ConsumerStep.NOTHING))
        return step

    def resume(self, *, ending: bool) -> ConsumerStep:
        """The drain's proof found a message: consume again (after setting the prefetch
        if a change it took over never sent its basic.qos)."""
        if ending:
            return self._end()
        if self.phase is not Phase.STOPPED:
            return ConsumerStep.NOTHING
        if self._stale_prefetch:
            self.phase = Phase.SETTING
            return ConsumerStep.SET_PREFETCH
        self.phase = Phase.CONSUMING
        return ConsumerStep.CONSUME

    def cancelled_by_broker(self) -> None:
        """The broker cancelled our consumer (queue deleted, leader moved, timeout)."""
        if self.phase is not Phase.ENDED:
            self.phase = Phase.NO_CONSUMER

"""typedq durable runs: a user's onboarding that waits a day, asks a human, and undoes its
work when the card is declined.

``onboard`` is a durable run: an ``async def`` whose calls on ``run`` are recorded, so that
it survives worker crashes and restarts, sleeps for a day without holding a worker, waits
for a typed ``approval`` signal and resumes where it was. It shows each call: a step (a job
of a task of the app), a sleep, a signal with a timeout, a ``do`` block (memoized inline
code), ``gather`` (two steps at once), ``emit`` (typed progress events for watchers) and a
saga: when charging the card fails after the welcome mail went out, compensating steps
close the account and apologise.

Run it with ``python examples/durable.py``. It drives three runs on the embedded broker on
virtual time (``typedq.testing``): the day's sleep and the week's timeout pass in
milliseconds. In production a worker process runs them (``typedq worker
examples.durable:app``), on a broker that keeps durable runs, and the sleep lasts a day.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import anyio
import msgspec
from pydantic import BaseModel

from typedq import App, JobFailed, Reject, Run, RunTimeout, Signal
from typedq.durable import StepCompleted
from typedq.testing import FakeClock, run_worker

# -- the models --------------------------------------------------------------------------


class NewUser(msgspec.Struct, frozen=True):
    email: str
    card: str


class Account(msgspec.Struct, frozen=True):
    id: str
    email: str


class Mail(msgspec.Struct, frozen=True):
    to: str
    subject: str


class Sent(msgspec.Struct, frozen=True):
    message_id: str


class Charge(msgspec.Struct, frozen=True):
    account_id: str
    card: str
    cents: int


class Receipt(msgspec.Struct, frozen=True):
    receipt_id: str


class CardDeclined(msgspec.Struct, frozen=True):
    """The charge's domain error: it travels as data to the run, which compensates."""

    card: str
    code: str


class Approval(BaseModel):
    """What a reviewer sends: the ``approval`` signal's payload."""

    ok: bool
    reviewer: str


class Progress(msgspec.Struct, frozen=True):
    """What the run emits to whoever watches it (``handle.emitted(Progress)``)."""

    stage: str
    done: int
    of: int


class Onboarded(msgspec.Struct, frozen=True):
    account_id: str
    active: bool
    risk: int
    note: str


#: A typed channel into runs: ``run.wait_for(approval)`` gives an Approval, and
#: ``handle.send(approval, ...)`` takes only an Approval (mypy checks both).
approval = Signal("approval", Approval)

app = App("onboarding")

# -- the tasks (each step of the run is a job of one of them) ---------------------------


@app.task
async def create_account(user: NewUser) -> Account:
    return Account(id="acct-" + user.email.split("@")[0], email=user.email)


@app.task
async def send_mail(mail: Mail) -> Sent:
    # A step's job id is ``run_id:position``, stable across replays: a mail provider's
    # idempotency key (``JobContext.job_id``) makes a repeated step send once.
    return Sent(message_id="msg-" + mail.subject.lower().replace(" ", "-"))


@app.task(retries=2, errors=(CardDeclined,))
async def charge_card(charge: Charge) -> Receipt:
    if charge.card.startswith("4000"):
        raise Reject(CardDeclined(card=charge.card[-4:], code="insufficient_funds"))
    return Receipt(receipt_id=f"rcpt-{charge.account_id}")


@app.task
async def close_account(account: Account) -> Account:
    return account


# -- the durable run ---------------------------------------------------------------------


def risk_score(email: str) -> int:
    """Stands for a call to a scoring service: code that must not run again on a replay."""
    return int(hashlib.sha256(email.encode()).hexdigest(), 16) % 100


@app.durable(retries=3)
async def onboard(run: Run, user: NewUser) -> Onboarded:
    account = await run.step(create_account, user)  # an Account, created once
    await run.emit(Progress(stage="account created", done=1, of=3))

    await run.sleep(timedelta(days=1))  # a day's trial: no worker is held meanwhile

    try:
        answer = await run.wait_for(approval, timeout=timedelta(days=7))
    except RunTimeout:  # nobody answered within the week
        await run.step(close_account, account)
        return Onboarded(account_id=account.id, active=False, risk=0, note="not reviewed")
    await run.emit(Progress(stage=f"reviewed by {answer.reviewer}", done=2, of=3))
    if not answer.ok:
        await run.step(close_account, account)
        return Onboarded(account_id=account.id, active=False, risk=0, note="refused")

    # Recorded the first time: every replay gets the same score without calling again.
    risk = await run.do("risk", lambda: risk_score(user.email))

    welcome = Mail(to=account.email, subject="Welcome aboard")
    charge = Charge(account_id=account.id, card=user.card, cents=900)
    try:
        _sent, receipt = await run.gather(  # both steps run at once
            run.step(send_mail, welcome), run.step(charge_card, charge)
        )
    except JobFailed as failed:
        # The saga: a failed step raises inside the run, typed, after its retries; undo
        # what was done, in steps of their own (recorded, so done once).
        declined = failed.domain_error(CardDeclined)
        code = declined.code if declined is not None else failed.reason.value
        await run.step(close_account, account)
        await run.step(send_mail, Mail(to=account.email, subject=f"Sorry: {code}"))
        await run.emit(Progress(stage="compensated", done=3, of=3))
        return Onboarded(account_id=account.id, active=False, risk=risk, note=f"declined: {code}")
    await run.emit(Progress(stage="charged", done=3, of=3))
    return Onboarded(account_id=account.id, active=True, risk=risk, note=receipt.receipt_id)


# -- driving it --------------------------------------------------------------------------


async def main() -> None:
    # Virtual time from 2026-01-01 00:00 UTC: a day's sleep ends when the test advances it.
    async with run_worker(app, clock=FakeClock(1_767_225_600.0)) as harness:
        ada = await onboard.start(NewUser("ada@example.com", "4242 4242"), run_id="user-ada")
        bob = await onboard.start(NewUser("bob@example.com", "4000 0002"), run_id="user-bob")
        cy = await onboard.start(NewUser("cy@example.com", "4242 4242"), run_id="user-cy")

        async def watch() -> None:
            # Typed events: `event` is a Progress (mypy knows), decoded from the log.
            async for event in ada.emitted(Progress):
                print(f"ada: {event.stage} ({event.done}/{event.of})")

        results: list[Onboarded] = []
        steps: list[str] = []
        async with anyio.create_task_group() as watchers:
            watchers.start_soon(watch)
            await harness.idle()  # every run has created its account and sleeps
            await harness.advance(timedelta(days=1).total_seconds())
            await harness.idle()  # every run now waits for its approval
            await ada.send(approval, Approval(ok=True, reviewer="grace"))
            await bob.send(approval, Approval(ok=True, reviewer="grace"))
            results += [await ada.result(timeout=10), await bob.result(timeout=10)]
            # The timeline, for tools (`typedq inspect --run user-bob` draws the same log);
            # read now: a finished run goes with the result retention (a day by default).
            steps += [e.task async for e in bob.events() if isinstance(e, StepCompleted)]
            # Nobody answers for cy: a week later, the wait times out.
            await harness.advance(timedelta(days=7).total_seconds())
            results.append(await cy.result(timeout=10))
        # (The watcher has ended: its iteration stops when ada's run has ended.)
        for result in results:
            print(result)
        print("bob's completed steps:", ", ".join(steps))


if __name__ == "__main__":
    anyio.run(main)

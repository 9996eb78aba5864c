"""typedq: a typed task queue. Handlers with model inputs and outputs, checked by mypy
from producer to result; an anyio runtime; Redis or an embedded broker.

The everyday names are here; the rest lives in the modules named by concept.
"""

from __future__ import annotations

from .app import App as App
from .backoff import Backoff as Backoff
from .broker.base import JobState as JobState
from .broker.base import Retention as Retention
from .client import Client as Client
from .context import JobContext as JobContext
from .durable import NonDeterministic as NonDeterministic
from .durable import Run as Run
from .durable import RunHandle as RunHandle
from .durable import RunTimeout as RunTimeout
from .durable import Signal as Signal
from .errors import Abort as Abort
from .errors import BrokerError as BrokerError
from .errors import BrokerUnavailable as BrokerUnavailable
from .errors import ConfigError as ConfigError
from .errors import EncodeError as EncodeError
from .errors import FailureReason as FailureReason
from .errors import FailureRecord as FailureRecord
from .errors import InvalidName as InvalidName
from .errors import InvalidOption as InvalidOption
from .errors import InvalidPayload as InvalidPayload
from .errors import JobCancelled as JobCancelled
from .errors import JobFailed as JobFailed
from .errors import JobNotFound as JobNotFound
from .errors import NotConnected as NotConnected
from .errors import PartialEnqueue as PartialEnqueue
from .errors import PayloadTooLarge as PayloadTooLarge
from .errors import QueueFull as QueueFull
from .errors import RedisDataLost as RedisDataLost
from .errors import Reject as Reject
from .errors import ResultTimeout as ResultTimeout
from .errors import Retry as Retry
from .errors import StreamInterrupted as StreamInterrupted
from .errors import StreamRestarted as StreamRestarted
from .errors import StreamTruncated as StreamTruncated
from .errors import TypedqError as TypedqError
from .errors import Unsupported as Unsupported
from .events import CompletedEvent as CompletedEvent
from .events import EventGap as EventGap
from .events import EventStream as EventStream
from .events import FailedEvent as FailedEvent
from .fair import Fair as Fair
from .fanin import Failed as Failed
from .fanin import Ok as Ok
from .flowcontrol import Debounce as Debounce
from .job import Job as Job
from .job import JobInfo as JobInfo
from .job import JobStatus as JobStatus
from .job import StreamJob as StreamJob
from .limits import ConcurrencyLimit as ConcurrencyLimit
from .limits import RateLimit as RateLimit
from .limits import RateLimited as RateLimited
from .producer import Producer as Producer
from .producer import StreamTaskStub as StreamTaskStub
from .producer import TaskStub as TaskStub
from .resources import Resource as Resource
from .resources import ResourceError as ResourceError
from .resources import Resources as Resources
from .schedule import Schedule as Schedule
from .task import UNSET as UNSET
from .task import Enqueuer as Enqueuer
from .task import StreamTask as StreamTask
from .task import Task as Task
from .worker import Worker as Worker
from .workflow import Chain as Chain
from .workflow import FanOut as FanOut
from .workflow import Flow as Flow

__version__ = "0.1.0"

__all__ = [
    "UNSET",
    "Abort",
    "App",
    "Backoff",
    "BrokerError",
    "BrokerUnavailable",
    "Chain",
    "Client",
    "CompletedEvent",
    "ConcurrencyLimit",
    "ConfigError",
    "Debounce",
    "EncodeError",
    "Enqueuer",
    "EventGap",
    "EventStream",
    "Failed",
    "FailedEvent",
    "FailureReason",
    "FailureRecord",
    "Fair",
    "FanOut",
    "Flow",
    "InvalidName",
    "InvalidOption",
    "InvalidPayload",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobState",
    "JobStatus",
    "NonDeterministic",
    "NotConnected",
    "Ok",
    "PartialEnqueue",
    "PayloadTooLarge",
    "Producer",
    "QueueFull",
    "RateLimit",
    "RateLimited",
    "RedisDataLost",
    "Reject",
    "Resource",
    "ResourceError",
    "Resources",
    "ResultTimeout",
    "Retention",
    "Retry",
    "Run",
    "RunHandle",
    "RunTimeout",
    "Schedule",
    "Signal",
    "StreamInterrupted",
    "StreamJob",
    "StreamRestarted",
    "StreamTask",
    "StreamTaskStub",
    "StreamTruncated",
    "Task",
    "TaskStub",
    "TypedqError",
    "Unsupported",
    "Worker",
]

"""A mypy plugin that checks ``@app.task(key=...)`` against the handler's input model,
and says that a handler's result must be a model.

A handler whose result is not a model (``-> int``) gets an error of code ``task-result``
on its decorator, ``A task handler must return a model (msgspec.Struct or
pydantic.BaseModel) or None, not "int"``: mypy alone, for a plain ``def``, says only that
it expected ``Callable[..., Awaitable[Never]]``.

It also checks the key functions of the limits, ``rate_limit=RateLimit(..., key=...)``
and ``concurrency=ConcurrencyLimit(..., key=...)``, and of ``debounce=Debounce(key=...)`` and ``fair=Fair(key=...)``: those are generic in the model their
key reads (``RateLimit[M]``), and the plugin narrows the parameter ``RateLimit[Any]`` to
``RateLimit[ThatModel]``, so mypy infers the constructor call in that context and checks
the lambda body against the handler's input type. (A limit built beforehand and stored
in a variable is checked where it is built, against what its own annotation says.)

Enable it next to pydantic's in the mypy configuration::

    [mypy]
    plugins = pydantic.mypy, typedq.mypy_plugin

Why a plugin is needed: for ::

    @app.task(key=lambda inv: f"{inv.invoice_id}")
    async def send_invoice(inv: SendInvoice) -> Receipt: ...

mypy type-checks the decorator expression ``app.task(key=...)`` on its own, before
applying its result to the function, so the lambda is checked against ``App.task``'s
signature alone, which cannot name the handler's input type. Typed
``Callable[[Any], str]`` (what the library declares) the lambda body is not checked at
all; with a type variable instead, mypy either infers ``Never`` for the parameter or
checks the body against the variable's bound (``msgspec.Struct | BaseModel``, which has
no ``invoice_id``). Neither checks what the user means.

What the plugin does: a method *signature* hook on ``App.task`` (and on ``task`` of
subclasses of ``App``). When the call is the innermost decorator of a function (or
``app.task(...)(handler)`` is called directly on a function), it reads that function's
declared first parameter type and, for this one call, narrows ``key`` from
``Callable[[Any], str]`` to ``Callable[[ThatModel], str]``. mypy then checks the lambda
body (``inv.nope`` is an ``attr-defined`` error, returning an ``int`` is a
``return-value`` error) and a named key function's parameter (``arg-type``).

Finding the function: mypy's AST has no parent links, so the plugin indexes, once per
module tree, every decorated function by the identity of its innermost decorator
expression (and ``f(...)(handler)`` calls by the identity of ``f(...)``).

Limits (each one falls back to the declared signature, i.e. ``key`` is unchecked):
the handler is unannotated, is a method, or its input type is ``Any`` or generic;
``app.task(...)`` is not the innermost decorator (another decorator changes what
``task`` receives); the decorator object is stored in a variable before being applied;
the App subclass is defined inside a function. The current module's tree is read from
the type checker's ``tree`` attribute, which the plugin interface does not promise; if a
mypy release drops it, the plugin falls back everywhere instead of failing. (``App.task``
is overloaded, so mypy also checks a ``key`` lambda once with ``Any`` parameters while
picking the overload: ``reveal_type`` inside the lambda shows ``Any``; errors come
from the typed pass.)

Tested by ``tests/typing_snippets/{pass,fail}/dedup_key*.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mypy.errorcodes import ErrorCode
from mypy.expandtype import expand_type
from mypy.maptype import map_instance_to_supertype
from mypy.messages import format_type
from mypy.nodes import (
    ARG_POS,
    FUNC_NO_INFO,
    AssignmentStmt,
    Block,
    CallExpr,
    ClassDef,
    Decorator,
    Expression,
    ExpressionStmt,
    FuncDef,
    MypyFile,
    OverloadedFuncDef,
    RefExpr,
    Statement,
    TypeInfo,
)
from mypy.options import Options
from mypy.plugin import MethodContext, MethodSigContext, Plugin
from mypy.types import (
    AnyType,
    CallableType,
    FunctionLike,
    Instance,
    NoneType,
    ProperType,
    Type,
    TypeVarType,
    UninhabitedType,
    UnionType,
    get_proper_type,
    has_type_vars,
)

__all__ = ["TypedqPlugin", "plugin"]

APP_FULLNAME = "typedq.app.App"
#: ``@app.task(...)``'s decorator: its ``__call__`` receives the handler.
DECORATOR_CALL = "typedq.task.TaskDecorator.__call__"
#: The error of a handler whose result is not a model.
TASK_RESULT = ErrorCode("task-result", "A task handler returns a model or None", "typedq")
#: What a handler may return (its job's result).
RESULT_BASES = ("msgspec.Struct", "pydantic.main.BaseModel")
TASK_FULLNAME = "typedq.task.Task"
#: The generic limit classes whose model parameter the plugin narrows.
LIMIT_FULLNAMES = frozenset(
    {
        "typedq.limits.RateLimit",
        "typedq.limits.ConcurrencyLimit",
        "typedq.flowcontrol.Debounce",
        "typedq.fair.Fair",
    }
)
#: The App.task parameters that take them.
LIMIT_PARAMETERS = ("rate_limit", "concurrency", "debounce", "fair")


# Attributes of compound statements that hold nested blocks (if/while/for/with/try/match).
_BLOCK_ATTRS = ("body", "else_body", "handlers", "finally_body", "bodies")


def _index_handlers(tree: MypyFile) -> dict[int, FuncDef]:
    """Map ``id()`` of each ``task(...)``-like call expression to the function it gets.

    mypy's compiled ``TraverserVisitor`` cannot be subclassed from an interpreted plugin,
    so this walks the statements itself: every function and class body, every nested
    block, and the top-level expression of assignments and expression statements.
    """
    handlers: dict[int, FuncDef] = {}

    def direct_call(expr: Expression) -> None:
        # app.task(key=...)(handler)
        if isinstance(expr, CallExpr) and isinstance(expr.callee, CallExpr) and len(expr.args) == 1:
            arg = expr.args[0]
            if isinstance(arg, RefExpr) and isinstance(arg.node, FuncDef):
                handlers[id(expr.callee)] = arg.node

    def walk(statements: Iterable[Statement]) -> None:
        for stmt in statements:
            if isinstance(stmt, Decorator):
                # Only the innermost decorator receives the function itself.
                if stmt.decorators and isinstance(stmt.decorators[-1], CallExpr):
                    handlers[id(stmt.decorators[-1])] = stmt.func
                walk(stmt.func.body.body)
            elif isinstance(stmt, FuncDef):
                walk(stmt.body.body)
            elif isinstance(stmt, OverloadedFuncDef):
                walk(stmt.items)
                if stmt.impl is not None:
                    walk([stmt.impl])
            elif isinstance(stmt, ClassDef):
                walk(stmt.defs.body)
            elif isinstance(stmt, AssignmentStmt):
                direct_call(stmt.rvalue)
            elif isinstance(stmt, ExpressionStmt):
                direct_call(stmt.expr)
            else:
                for attr in _BLOCK_ATTRS:
                    value = getattr(stmt, attr, None)
                    blocks = value if isinstance(value, list) else [value]
                    for block in blocks:
                        if isinstance(block, Block):
                            walk(block.body)

    walk(tree.defs)
    return handlers


class TypedqPlugin(Plugin):
    """Narrows ``App.task(key=...)`` to the decorated handler's input type."""

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        # The tree being checked and its index. mypy checks one module at a time, so one
        # entry suffices, and trees of finished modules are not kept alive.
        self._index: tuple[MypyFile, dict[int, FuncDef]] | None = None

    def get_method_signature_hook(
        self, fullname: str
    ) -> Callable[[MethodSigContext], FunctionLike] | None:
        # Subclasses of App name their own class here. Only claim App and its subclasses:
        # another library's `.task` hook (a plugin later in the list) must still run.
        class_name, _, method = fullname.rpartition(".")
        if method not in ("task", "schedule"):
            return None
        if class_name != APP_FULLNAME:
            symbol = self.lookup_fully_qualified(class_name)
            if symbol is None or not isinstance(symbol.node, TypeInfo):
                return None
            if not symbol.node.has_base(APP_FULLNAME):
                return None
        return self._narrow_key if method == "task" else self._bind_payload

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        # The handler reaches App.task (`@app.task`) or the decorator it returns
        # (`@app.task(...)`): either checks that its result is a model.
        class_name, _, method = fullname.rpartition(".")
        if fullname == DECORATOR_CALL or (method == "task" and class_name == APP_FULLNAME):
            return _check_result_model
        if method != "task":
            return None
        symbol = self.lookup_fully_qualified(class_name)
        if symbol is None or not isinstance(symbol.node, TypeInfo):
            return None
        return _check_result_model if symbol.node.has_base(APP_FULLNAME) else None

    def _bind_payload(self, ctx: MethodSigContext) -> FunctionLike:
        """``app.schedule(task, payload)``: the payload's type is the task's input model.

        Declared as ``(task: Task[TIn, Any], payload: TIn)``, a payload of another model
        leaves mypy unable to solve ``TIn`` ("Cannot infer value of type parameter").
        Bound from the task alone, the payload gets the usual ``arg-type`` error naming
        both models.
        """
        sig = ctx.default_signature
        if not ctx.args or not ctx.args[0] or not isinstance(sig, CallableType):
            return sig
        task_type = get_proper_type(ctx.api.get_expression_type(ctx.args[0][0]))
        if not isinstance(task_type, Instance) or not task_type.type.has_base(TASK_FULLNAME):
            return sig
        task_info = self.lookup_fully_qualified(TASK_FULLNAME)
        if task_info is None or not isinstance(task_info.node, TypeInfo):
            return sig
        as_task = map_instance_to_supertype(task_type, task_info.node)
        if not as_task.args:
            return sig
        model = as_task.args[0]
        if has_type_vars(model) or isinstance(get_proper_type(model), AnyType):
            return sig
        bound = [v for v in sig.variables if v.name == "TIn"]
        if len(bound) != 1:
            return sig
        expanded = get_proper_type(expand_type(sig, {bound[0].id: model}))
        if not isinstance(expanded, CallableType):
            return sig
        return expanded.copy_modified(variables=[v for v in sig.variables if v.name != "TIn"])

    def _narrow_key(self, ctx: MethodSigContext) -> FunctionLike:
        sig = ctx.default_signature
        receiver = get_proper_type(ctx.type)
        if not (isinstance(receiver, Instance) and receiver.type.has_base(APP_FULLNAME)):
            return sig
        if "key" not in sig.arg_names or not isinstance(ctx.context, CallExpr):
            return sig
        handler = self._handler(ctx.api, ctx.context)
        model = _input_type(handler) if handler is not None else None
        if model is None:
            return sig
        arg_types = list(sig.arg_types)
        position = sig.arg_names.index("key")
        key_type = _with_parameter(sig.arg_types[position], model)
        if key_type is not None:
            arg_types[position] = key_type
        for name in LIMIT_PARAMETERS:
            if name in sig.arg_names:
                position = sig.arg_names.index(name)
                limit_type = _with_model(sig.arg_types[position], model)
                if limit_type is not None:
                    arg_types[position] = limit_type
        return sig.copy_modified(arg_types=arg_types)

    def _handler(self, api: object, call: CallExpr) -> FuncDef | None:
        # The type checker's current module; not part of the plugin interface, hence getattr.
        tree = getattr(api, "tree", None)
        if not isinstance(tree, MypyFile):
            return None
        if self._index is None or self._index[0] is not tree:
            self._index = (tree, _index_handlers(tree))
        return self._index[1].get(id(call))


def _input_type(handler: FuncDef) -> Type | None:
    """The declared type of a plain function's first positional parameter, if usable."""
    sig = handler.type
    if handler.info is not FUNC_NO_INFO or not isinstance(sig, CallableType):
        return None
    if not sig.arg_types or sig.arg_kinds[0] != ARG_POS:
        return None
    model = sig.arg_types[0]
    if has_type_vars(model) or isinstance(get_proper_type(model), AnyType):
        return None
    return model


def _with_parameter(declared: Type, model: Type) -> Type | None:
    """``Callable[[Any], str] | None`` with its callable's parameter replaced by ``model``."""

    def replace(item: ProperType) -> Type | None:
        if isinstance(item, CallableType) and len(item.arg_types) == 1:
            return item.copy_modified(arg_types=[model])
        return None

    return _replace_items(declared, replace)


def _with_model(declared: Type, model: Type) -> Type | None:
    """``RateLimit[Any] | None`` (or ConcurrencyLimit) with its model replaced by ``model``."""

    def replace(item: ProperType) -> Type | None:
        if (
            isinstance(item, Instance)
            and item.type.fullname in LIMIT_FULLNAMES
            and len(item.args) == 1
        ):
            return item.copy_modified(args=[model])
        return None

    return _replace_items(declared, replace)


def _replace_items(declared: Type, replace: Callable[[ProperType], Type | None]) -> Type | None:
    """``declared`` (a union or a single type) with each item that ``replace`` rewrites
    replaced; None when it rewrites none (the caller keeps the declared type)."""
    proper = get_proper_type(declared)
    items = proper.items if isinstance(proper, UnionType) else [declared]
    new_items = [replace(get_proper_type(item)) for item in items]
    if all(item is None for item in new_items):
        return None
    merged = [old if new is None else new for old, new in zip(items, new_items, strict=True)]
    return UnionType.make_union(merged, declared.line, declared.column)


def _check_result_model(ctx: MethodContext) -> Type:
    """A handler whose result is not a model gets an error that says so (mypy alone says
    ``expected ... Awaitable[Never]`` for a plain ``def`` returning ``int``)."""
    if not ctx.arg_types or len(ctx.arg_types[0]) != 1:
        return ctx.default_return_type
    handler = get_proper_type(ctx.arg_types[0][0])
    if not isinstance(handler, CallableType):
        return ctx.default_return_type
    result = get_proper_type(handler.ret_type)
    if (
        isinstance(result, Instance)
        and result.type.fullname == "typing.Coroutine"
        and len(result.args) == 3
    ):
        result = get_proper_type(result.args[2])  # an async def's result
    if _is_result_model(result):
        return ctx.default_return_type
    ctx.api.fail(
        f"A task handler must return a model (msgspec.Struct or pydantic.BaseModel) or "
        f"None, not {format_type(result, ctx.api.options)}: wrap the value in a model",
        ctx.context,
        code=TASK_RESULT,
    )
    return ctx.default_return_type


def _is_result_model(result: ProperType) -> bool:
    if isinstance(result, AnyType | NoneType | UninhabitedType | TypeVarType):
        return True
    if isinstance(result, UnionType):
        return all(_is_result_model(get_proper_type(item)) for item in result.items)
    return isinstance(result, Instance) and any(result.type.has_base(b) for b in RESULT_BASES)


def plugin(version: str) -> type[TypedqPlugin]:
    """The entry point mypy calls with its version string."""
    return TypedqPlugin

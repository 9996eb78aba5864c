"""Worker's type parameters come from its task and cannot be claimed otherwise."""

from __future__ import annotations

from snip import Receipt, SendInvoice, app

from typedq import Task, Worker


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


# E: arg-type "Task[SendInvoice, Receipt]"; expected "Task[Receipt, SendInvoice]"
# P: reportAssignmentType "Worker[SendInvoice, Receipt]" is not assignable to declared type
swapped: Worker[Receipt, SendInvoice] = Worker(send_invoice)
wrong_task: Task[Receipt, Receipt] = send_invoice  # E: assignment
# E: call-overload No overload variant of "Worker" matches argument type "Callable[..., Any]"
# P: reportCallIssue No overloads for "__init__"  # P: reportArgumentType "(...) -> Any"
not_a_task: Worker[SendInvoice, Receipt] = Worker(send_invoice.fn)
not_a_model: Worker[int, Receipt]  # E: type-var Type argument "int" of "Worker"
# E: call-overload matches argument types "Task[SendInvoice, Receipt]", "str"
# P: reportCallIssue No overloads  # P: reportArgumentType parameter "concurrency"
bad_concurrency = Worker(send_invoice, concurrency="8")

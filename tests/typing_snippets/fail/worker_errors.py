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
# E: arg-type "Callable[..., Any]"; expected "Task[SendInvoice, Receipt]"
# P: reportArgumentType "(...) -> Any" cannot be assigned  # P: reportUnknownVariableType
not_a_task: Worker[SendInvoice, Receipt] = Worker(send_invoice.fn)
not_a_model: Worker[int, Receipt]  # E: type-var Type argument "int" of "Worker"
bad_concurrency = Worker(send_invoice, concurrency="8")  # E: arg-type "concurrency"

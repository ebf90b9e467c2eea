"""Human- and model-readable reports of a failing test (METHOD §1.2: each part cut around its
middle)."""

from __future__ import annotations

PART_LIMIT = 400


def truncate_middle(text: str, limit: int = PART_LIMIT) -> str:
    """Keep the head and the tail of `text` so that at most `limit` characters of it remain."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n... ({len(text) - limit} characters cut) ...\n{text[-tail:]}"


def test_report(
    status: str,
    test_input: str,
    expected: str,
    stdout: str = "",
    stderr: str = "",
    result: str | None = None,
    fn_name: str | None = None,
    timeout_s: float | None = None,
    output_bytes: int | None = None,
) -> str:
    """The report of one failing test, in the words the feedback turn shows the model."""
    if status == "passed":
        return ""
    if fn_name:
        lines = [f"Arguments of {fn_name} (one JSON value per line):", truncate_middle(test_input)]
    else:
        lines = ["Input:", truncate_middle(test_input)]
    err = stderr.strip()
    if status == "syntax_error":
        return "The program does not compile:\n" + truncate_middle(err)
    if status == "timeout":
        lines.append(f"The program exceeded the time limit of {timeout_s:g} seconds.")
    elif status == "output_limit":
        lines.append(f"The program printed more than {output_bytes} bytes and was stopped.")
    elif status == "memory_limit":
        lines.append("The program exceeded the memory limit.")
        if err:
            lines += ["Error:", truncate_middle(err)]
    elif status == "runtime_error":
        lines.append("The program crashed:" if err else "The program exited with an error.")
        if err:
            lines.append(truncate_middle(err))
    elif status in ("skipped", "sandbox_error"):
        lines.append(
            "This test was not run: the time for the whole test suite ran out."
            if status == "skipped"
            else "The sandbox failed while running this test."
        )
    else:  # wrong_answer
        shown = result if fn_name else stdout
        label = "Returned value:" if fn_name else "Program output:"
        lines += [label, truncate_middle(shown or "")]
        lines += ["Expected output:", truncate_middle(expected)]
    return "\n".join(lines)

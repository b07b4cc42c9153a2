"""`evotrainer report`: the HTML page of a run with nothing trained yet, a hostile hypothesis, a gate's rejection."""

import re
import sys
import time

from evotrainer.agents.schemas import VerdictRecord
from evotrainer.workspaces.run import RunWorkspace

from .conftest import run_cli

HOSTILE = "If <script>alert(1)</script> & \"quotes\", dev improves"


def _candidate(ws: RunWorkspace, name: str, weight: str, hypothesis: str) -> str:
    repo = ws.harness
    branch, wt = repo.create_candidate(1, name, ws.path / "worktrees")
    y = wt / "harness.yaml"
    y.write_text(y.read_text().replace("weight: 0.1 ", f"weight: {weight} "))
    repo.commit(wt, f"Set the format weight to {weight}", intervention_id=f"i-{name}", hypothesis=hypothesis,
                factor="reward.answer_format.weight", generation=1)
    return branch


def test_report_of_a_run_with_nothing_trained(tmp_path):
    ws = RunWorkspace.create(tmp_path / "run", "math")
    hostile = _candidate(ws, "hostile", "0.3", HOSTILE)
    gated = _candidate(ws, "gated", "0.5", "If the format weight is 0.5, format failures drop")
    verdict = VerdictRecord(branch=gated, decision="reject", reasons=["failed gate unsealed_reward <b>"],
                            failed_gates=["unsealed_reward"], generation=1)
    verdict.save(ws.verdict_path(gated))
    ws.harness.reject(gated, 1, "failed gate unsealed_reward", verdict.model_dump())

    proc = run_cli("report", str(ws.path))
    assert proc.returncode == 0, proc.stderr
    path = ws.path / "reports" / "report.html"
    assert f"report: {path}" in proc.stdout.replace("\n", "")
    page = path.read_text()
    # every candidate, each with its status; the missing pieces named, not an error
    assert hostile in page and gated in page
    assert 'badge open">open (not judged yet)' in page and 'badge gate">rejected by a gate' in page
    for missing in ("no backtest report yet", "no verdict yet", "no generation has been evaluated on sealed dev yet",
                    "no health report yet", "no skill distilled yet", "no reports/summary.json"):
        assert missing in page, missing
    # the diff against the parent, coloured, and nothing of the hostile text left unescaped
    assert '<span class="del">-    <span class="tk">weight</span>: <span class="tn">0.1</span>' in page
    assert '<span class="add">+    <span class="tk">weight</span>: <span class="tn">0.3</span>' in page
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "failed gate unsealed_reward &lt;b&gt;" in page
    assert not re.search(r"https?://|\bsrc=|\bhref=", page)

    out = tmp_path / "elsewhere" / "r.html"
    assert run_cli("report", str(ws.path), "--out", str(out)).returncode == 0 and out.read_text() == page

    # --open hands the page to the browser $BROWSER names (here a command that records what it was given)
    opened = tmp_path / "opened"
    browser = f"{sys.executable} -c \"import sys; open({str(opened)!r}, 'w').write(sys.argv[1])\" %s"
    proc = run_cli("report", str(ws.path), "--open", env={"BROWSER": browser})
    assert proc.returncode == 0, proc.stderr
    for _ in range(50):  # the browser command runs in the background
        if opened.is_file() and opened.read_text():
            break
        time.sleep(0.1)
    assert opened.read_text() == path.resolve().as_uri()


def test_a_diff_is_highlighted_as_its_files_language_and_stays_escaped():
    from evotrainer.report import diff_html

    page = diff_html("--- a/rewards.py\n+++ b/rewards.py\n@@ -1 +1 @@\n"
                     "-    return [1.0 if c == '4#2' else 0 for c in xs]  # <b>old</b>\n"
                     "+    return [0.5 if c == \"</span><script>\" else None for c in xs]\n"
                     "--- a/harness.yaml\n+++ b/harness.yaml\n@@ -1 +1 @@\n+  - name: drop  # if true\n")
    # a `#` inside a string is no comment
    assert ('<span class="del">-    <span class="tk">return</span> [<span class="tn">1.0</span> '
            '<span class="tk">if</span> c == <span class="ts">&#x27;4#2&#x27;</span>') in page
    assert '<span class="tc"># &lt;b&gt;old&lt;/b&gt;</span></span>' in page
    assert '<span class="ts">&quot;&lt;/span&gt;&lt;script&gt;&quot;</span>' in page and "<script" not in page
    assert '<span class="tk">None</span>' in page and '<span class="hunk">@@ -1 +1 @@</span>' in page
    # YAML: keys, not Python's keywords ("if" in a comment, "true" inside it stays the comment's)
    assert '+  - <span class="tk">name</span>: drop  <span class="tc"># if true</span></span>' in page


def test_report_refuses_what_is_not_a_run(tmp_path):
    proc = run_cli("report", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "is not an EvoTrainer run" in proc.stderr and "Traceback" not in proc.stderr

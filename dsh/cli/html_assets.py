"""The inline CSS and script of ``dsh sessions export --html`` (:mod:`dsh.cli.export_html`).

Constants only: nothing from a session is ever put in them. The page's Content-Security-Policy
allows exactly this script, by its SHA-256.
"""

from __future__ import annotations

CSS = """
:root{--fg:#1d1f21;--mute:#6b7280;--line:#e5e7eb;--user:#eef6ff;--asst:#f6f6f6;
--tool:#fffaf0;--bad:#b91c1c;--in:#3b82f6;--out:#f59e0b}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;color:var(--fg);margin:0;
padding:0 1.2rem 3rem;max-width:1100px}
header{border-bottom:1px solid var(--line);margin-bottom:1rem}
h1{font-size:1.25rem;margin:1rem 0 .3rem}h2{font-size:1rem;margin:1.2rem 0 .4rem}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:.3rem 0;max-height:40em;overflow:auto}
.summary,.usage,.status,.size,.step-h{color:var(--mute)}
.step{border-left:3px solid var(--line);padding-left:.7rem;margin:.4rem 0 .8rem}
.step-h{font-size:12px;text-transform:uppercase;letter-spacing:.05em}
.ev{padding:.35rem .6rem;border-radius:6px;margin:.3rem 0;contain:content}
.user{background:var(--user)}.assistant{background:var(--asst)}.tool-call{background:var(--tool)}
.system,.context,.plugin,.unknown{background:#f3f4f6}
.compaction{background:#ecfdf5;border:1px dashed #10b981}
.rejected,.tool-call.error,.end.error,.end.aborted{border-left:3px solid var(--bad)}
.result{border-top:1px dotted var(--line)}
.change summary{font:12px ui-monospace,monospace;color:#6d28d9}
pre.diff span{display:block}pre.diff .add{background:#dcfce7;color:#166534}
pre.diff .del{background:#fee2e2;color:#991b1b}pre.diff .hunk{color:#0e7490}
pre.diff .meta{font-weight:bold}pre.diff .ctx{color:var(--mute)}
.subagent{margin:.4rem 0 .2rem 1rem;border-left:2px solid #a78bfa;padding-left:.6rem}
.reasoning{color:#4b5563;font-style:italic}.cut{color:var(--bad);font-size:12px}
.attachment img{max-width:480px;max-height:360px;display:block;margin:.3rem 0}
svg.chart{width:100%;max-width:800px;height:auto}
svg.chart .in{fill:var(--in)}svg.chart .out{fill:var(--out)}
svg.chart .cost{fill:none;stroke:#111;stroke-width:1.5}
svg.chart text{font-size:11px;fill:var(--mute)}
svg.chart .axis{stroke:#6b7280;stroke-width:1}svg.chart .grid{stroke:var(--line);stroke-width:1}
svg.chart .axis-title{font-size:12px;fill:var(--fg)}
.tool-call.not-run{border-left:3px dashed var(--mute)}
.plugin .line,.plugin code.data{color:var(--mute);overflow-wrap:anywhere}
button{font:inherit;padding:.1rem .6rem}
"""

SCRIPT = """(function(){
function all(open){var d=document.querySelectorAll('details');
for(var i=0;i<d.length;i++){d[i].open=open;}}
document.getElementById('open-all').addEventListener('click',function(){all(true);});
document.getElementById('close-all').addEventListener('click',function(){all(false);});
document.documentElement.setAttribute('data-ready','1');
})();"""

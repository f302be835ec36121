"""The package's structure: data flows one way (no import cycles, none hidden in
functions), no hand-written module is over 700 lines nor function over 80, only a
stage's module compares stage names, every pipeline flag is read by a typed config,
removed flags say what replaced them, and only result-affecting settings guard an
output folder."""
from __future__ import annotations

import ast
import dataclasses
import glob
import os

import pytest

from pipeline_helpers import REPO, flag_values

PACKAGE = os.path.join(REPO, "tinybert_tf")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80
# Generated from tflite-support's metadata_schema.fbs by flatc, not written by hand.
GENERATED = {os.path.join("tinybert_tf", "export", "tflite_metadata_schema.py")}


def _module(path: str) -> str:
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _imports() -> tuple[dict[str, set[str]], list[str]]:
    """Module -> package modules it imports at module level; and function-level imports."""
    graph, hidden = {}, []
    files = glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)
    modules = {_module(p) for p in files}
    for path in files:
        name = _module(path)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        deps = set()
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("tinybert_tf"):
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("tinybert_tf")]
            targets = [t for t in targets if t in modules]
            if not targets:
                continue
            if node.col_offset > 0 and name != "tinybert_tf":
                hidden.append(f"{name}:{node.lineno} imports {targets[0]} inside a function")
            deps.update(targets)
        graph[name] = deps - {name}
    return graph, hidden


def test_no_import_cycles_and_none_hidden_in_functions():
    graph, hidden = _imports()
    assert not hidden, hidden
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in graph.get(node, ()):
            # A package imports its submodules through __init__; those edges are not cycles.
            if node.startswith(dep + "."):
                continue
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join(path + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_hand_written_module_is_over_700_lines():
    sizes = {}
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, REPO)
        if rel not in GENERATED:
            with open(path, encoding="utf-8") as f:
                sizes[rel] = sum(1 for _ in f)
    assert len(sizes) > 20 and all(rel.startswith("tinybert_tf") for rel in sizes)
    over = {rel: n for rel, n in sorted(sizes.items()) if n > MAX_MODULE_LINES}
    assert not over, (f"modules over {MAX_MODULE_LINES} lines {over}: split each where a "
                      "reader would look for its second concern")


def test_no_hand_written_function_is_over_80_lines():
    long = []
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        rel = os.path.relpath(path, REPO)
        if rel in GENERATED:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        long += [f"{rel}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
                 for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_pipeline_flag_is_read_by_a_typed_config():
    from tinybert_tf.pipeline import flags as tb_flags
    from tinybert_tf.pipeline.settings.configs import PART_TYPES
    fv = tb_flags.distill_flags()
    defined = {name for name in fv} - {"flagfile", "undefok", "helpshort", "helpfull",
                                        "helpxml", "help", "?"}
    read = {f.metadata.get("flag", f.name) for part in PART_TYPES.values()
            for f in dataclasses.fields(part)}
    assert defined == read, {"defined, never read": sorted(defined - read),
                             "read, never defined": sorted(read - defined)}


def test_a_removed_flag_names_its_replacement(tmp_path):
    from tinybert_tf.pipeline.main import UsageError, run_argv
    with pytest.raises(UsageError, match=r"--shard:.*bin/augment --shard"):
        run_argv(["bin/distill", f"--output_dir={tmp_path}", "--shard=0/2"])
    with pytest.raises(UsageError, match="--model_dir.*bin/export"):
        run_argv(["bin/distill", f"--output_dir={tmp_path}", "--model_dir=x"])


def test_run_config_holds_exactly_the_result_affecting_settings():
    from tinybert_tf.pipeline.settings.configs import PipelineConfig
    base = PipelineConfig.from_flags(flag_values(output_dir="o"))
    for name, value in (("export_threads", 3), ("export_latency_runs", 2), ("stages", ["task"]),
                        ("checkpoint_every", 7), ("eval_batch_size", 8), ("strategy", "mirrored")):
        other = PipelineConfig.from_flags(flag_values(output_dir="o", **{name: value}))
        assert other.results() == base.results(), name
    for name, value in (("representative_examples", 5), ("export_formats", ["float32"]),
                        ("seed", 7), ("num_aug", 3), ("hard_label_weight", 0.5)):
        other = PipelineConfig.from_flags(flag_values(output_dir="o", **{name: value}))
        assert other.results()[name] != base.results()[name], name


def test_nothing_in_the_package_imports_the_tools_and_each_bin_script_is_a_launcher():
    graph, _ = _imports()
    users = sorted(m for m, deps in graph.items() if not m.startswith("tinybert_tf.tools")
                   and any(d.startswith("tinybert_tf.tools") for d in deps))
    assert not users, f"the tools sit on top of the package; imported by {users}"
    for name in ("augment", "benchmark", "export", "pretokenize"):
        with open(os.path.join(REPO, "bin", name), encoding="utf-8") as f:
            text = f.read()
        assert len(text.splitlines()) <= 20, name
        assert f"from tinybert_tf.tools.{name} import entry_point" in text, name


def test_only_a_stage_module_compares_a_stage_name():
    """Code that loops over stages asks the registry (`Stage` fields such as needs,
    folder, handover) instead of testing a built-in stage's name; a stage's module may
    name the stages it reads."""
    from tinybert_tf.pipeline.stages import BUILT_IN
    names = {module.NAME for module in BUILT_IN}
    stages_dir = os.path.join(PACKAGE, "pipeline", "stages")
    found = []
    for folder in ("pipeline", "paper"):
        for path in glob.glob(os.path.join(PACKAGE, folder, "**", "*.py"), recursive=True):
            if path.startswith(stages_dir + os.sep):
                continue
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Compare):
                    continue
                for side in (node.left, *node.comparators):
                    items = side.elts if isinstance(side, (ast.Set, ast.Tuple, ast.List)) \
                        else [side]
                    found += [f"{os.path.relpath(path, REPO)}:{node.lineno} {item.value!r}"
                              for item in items if isinstance(item, ast.Constant)
                              and item.value in names]
    assert not found, found

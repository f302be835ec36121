"""docs/extending.md: every Python block runs, in order, as a newcomer would paste them,
and each adds a capability without editing the package."""
from __future__ import annotations

import json
import os
import re

import pytest

from pipeline_helpers import REPO

DOC = os.path.join(REPO, "docs", "extending.md")


def _blocks() -> list[str]:
    with open(DOC, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@pytest.fixture
def registries():
    """Snapshots of every registry, restored after the test (the doc registers examples)."""
    from tinybert_tf.data import sources
    from tinybert_tf.distill import terms
    from tinybert_tf.export import formats
    from tinybert_tf.pipeline.stages import base as stage_base
    from tinybert_tf.pipeline.training import phases, recipes, strategy
    from tinybert_tf.tasks import base, catalog
    tables = [terms.TERMS, base.TASK_TYPES, catalog.TASK_FACTORIES, sources.SOURCES,
              formats.FORMATS, strategy.BUILDERS, phases.PHASE_KINDS, recipes.RECIPES,
              stage_base.STAGE_TABLE]
    saved = [dict(t) for t in tables]
    order = list(stage_base._ORDER)
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    stage_base._ORDER[:] = order


def test_every_example_of_the_extending_guide_runs(registries):
    blocks = _blocks()
    assert len(blocks) == 9, "setup + one example per extension point"
    namespace: dict = {"__name__": "extending_doc"}
    for block in blocks:
        exec(compile(block, DOC, "exec"), namespace)  # the blocks assert their own results
    from tinybert_tf.data.sources import SOURCES
    from tinybert_tf.distill.terms import TERMS
    from tinybert_tf.export.formats import FORMATS
    from tinybert_tf.pipeline.training.phases import PHASE_KINDS
    from tinybert_tf.pipeline.training.recipes import RECIPES
    from tinybert_tf.pipeline.training.strategy import BUILDERS
    from tinybert_tf.tasks import TASK_FACTORIES, TASK_TYPES
    assert "soft_and_hard" in PHASE_KINDS
    assert "clscos" in TERMS and "multi_label" in TASK_TYPES and "fasttext" in SOURCES
    assert "fasttext_sentiment" in TASK_FACTORIES and "npz" in FORMATS
    assert "cpu_pair" in BUILDERS and "attention_only" in RECIPES
    from tinybert_tf.pipeline.stages import STAGE_TABLE
    assert "layer_sizes" in STAGE_TABLE


def test_the_guides_plugin_stage_runs_in_order_is_planned_and_skipped_when_done(
        registries, tmp_path, tiny_vocab, capsys):
    """The guide's stage, registered after export: `--stages=all` ends with it, the dry
    run plans it, it runs on a finished task stage, and a rerun skips it as done."""
    from tinybert_tf.models.checkpoint import load_model, save_model
    from tinybert_tf.pipeline import stage_io
    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.pipeline.preflight import resolve_stages
    from tinybert_tf.pipeline.run.context import Context
    from tinybert_tf.pipeline.run.state import RunState
    from tinybert_tf.tasks.catalog import resolve_task

    from pipeline_helpers import argv, run, tiny_flags, write_teacher
    exec(compile(_blocks()[-1], DOC, "exec"), {"__name__": "extending_doc"})
    teacher = write_teacher(str(tmp_path / "task_teacher"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp_path, tiny_vocab, task_teacher=teacher, general_model="none",
                    use_augmented=False, stages=["layer_sizes"])
    config = parse_argv(["bin/distill", *argv(ns)])
    assert resolve_stages(["all"], config)[-2:] == ["export", "layer_sizes"]
    # A finished task stage (its model: the teacher's copy), without training one.
    state = RunState(config.run.output_dir)
    ctx = Context(config, resolve_task(config.task), state, None)
    state.write_config(config.results())
    save_model(load_model(teacher), state.work_path("task", "model"))
    state.mark_done("task", {}, config.stage_settings("task"),
                    stage_io.upstream_fingerprints(ctx, "task"), stage_io.reads_of(ctx, "task"),
                    stage_io.outputs_of(ctx, "task"))

    plan = run(type(ns)(**{**vars(ns), "dry_run": True}))
    assert plan["stages"] == ["layer_sizes"]
    capsys.readouterr()
    results = run(ns)
    sizes = json.load(open(tmp_path / "out" / "layer_sizes" / "params.json"))
    assert results["layer_sizes"]["parameters"] == sum(sizes.values()) > 0
    assert "parameters per layer" in capsys.readouterr().out
    run(ns)
    assert "== layer_sizes: done already, skipped" in capsys.readouterr().out


def test_a_plugin_term_is_accepted_by_bin_distill_flags(registries, tmp_path, monkeypatch):
    """--plugins imports a user module whose term --loss_terms then names."""
    from tinybert_tf.pipeline.main import parse_argv
    (tmp_path / "my_terms.py").write_text(_blocks()[0] + "\n" + _blocks()[1])
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_argv(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                         "--plugins=my_terms", "--loss_terms=attn,clscos"])
    assert config.loss.loss_terms == ("attn", "clscos")
    from tinybert_tf.distill.terms import make_terms
    assert [t.name for t in make_terms(config.loss.loss_terms)] == ["attn", "clscos"]


def test_a_model_of_a_plugins_task_is_exported_with_its_plugins(registries, tmp_path,
                                                               tiny_vocab, monkeypatch, capsys):
    """bin/export, bin/augment and bin/benchmark take --plugins as bin/distill does. A task
    model records its run's --plugins, so bin/export without them names the module to
    pass (it said only "unknown task", and had no --plugins to pass)."""
    import sys

    from tinybert_tf import plugins
    from tinybert_tf.config import BertConfig
    from tinybert_tf.data import sources
    from tinybert_tf.models import BertModel
    from tinybert_tf.models.checkpoint import save_model
    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.pipeline.run.context import Context
    from tinybert_tf.pipeline.run.state import RunState
    from tinybert_tf.tasks import catalog

    from pipeline_helpers import run_tool
    name = "fasttext_plugin_for_tools"  # a module no other test imports
    source_block = next(b for b in _blocks() if "class FastTextSource" in b)
    (tmp_path / f"{name}.py").write_text(source_block.split("folder = tempfile")[0])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    data = {}
    for split in ("train", "dev"):
        data[split] = tmp_path / f"{split}.txt"
        data[split].write_text("__label__pos a great film\n__label__neg the plot was awful\n")
    task_flags = ["--task=fasttext_sentiment", f"--train_file={data['train']}",
                  f"--validation_file={data['dev']}"]
    try:
        config = parse_argv(["bin/distill", f"--output_dir={tmp_path / 'run'}",
                             f"--plugins={name}", *task_flags, "--nouse_augmented",
                             "--max_seq_len=16"])
        record = Context(config, catalog.resolve_task(config.task),
                         RunState(config.run.output_dir), None).trained_on()
        assert record["plugins"] == [name] and record["task"]["task"] == "fasttext_sentiment"
        vocab = list(dict.fromkeys(tiny_vocab))
        bert = BertConfig(vocab_size=len(vocab), hidden_size=16, num_layers=1, num_heads=2,
                          intermediate_size=32, max_position_embeddings=64)
        model = save_model(BertModel(bert, head="classifier", label_names=["neg", "pos"],
                                     vocab=vocab), str(tmp_path / "model"), metadata=record)
        # A fresh bin/export process: the plugin's task and source are not registered.
        del catalog.TASK_FACTORIES["fasttext_sentiment"], sources.SOURCES["fasttext"]
        del sys.modules[name], plugins._LOADED[name]
        export = [f"--model_dir={model}", f"--output_dir={tmp_path / 'out'}",
                  "--export_formats=float32", "--export_latency_runs=1"]
        capsys.readouterr()
        assert run_tool("export", *export) == 2
        err = capsys.readouterr().err
        assert f"was trained on --task=fasttext_sentiment, which no module loaded here " \
               f"registers: pass --plugins={name} as the training run did" in err, err
        assert not (tmp_path / "out").exists()
        assert run_tool("export", *export, f"--plugins={name}") == 0, capsys.readouterr().err
        parity = json.loads((tmp_path / "out" / "export" / "parity.json").read_text())
        assert parity["task"] == "fasttext_sentiment" and parity["num_examples"] == 2
        # bin/augment resolves the plugin's task (whose source cannot be augmented).
        capsys.readouterr()
        assert run_tool("augment", f"--plugins={name}", *task_flags, "--augment_fallback",
                        f"--output={tmp_path / 'aug' / 'train_aug.tsv'}") == 2
        assert "fasttext data cannot be augmented in place" in capsys.readouterr().err
        # bin/benchmark imports them before it checks its runtimes.
        assert run_tool("benchmark", "--plugins=no_such_plugin_module", "--quick",
                        f"--benchmark_output={tmp_path / 'bench'}") == 2
        assert "--plugins=no_such_plugin_module: cannot import it: no such module" \
            in capsys.readouterr().err
    finally:
        sys.modules.pop(name, None)


# --- plugins may not replace built-ins silently, and their errors are theirs ----------------

PLUGINS = {
    "term_attn": ("from tinybert_tf.distill import LossTerm, register_term\n"
                  "@register_term{how}\nclass Mine(LossTerm):\n    name = 'attn'\n",
                  r"loss term 'attn' is already registered \(tinybert_tf\.distill\.terms\."
                  r"AttentionTerm\); registering Mine by term_attn \(.*term_attn\.py\)"),
    "task_sst2": ("from tinybert_tf.tasks import register_task\n"
                  "@register_task('SST-2'{how_kw})\ndef mine(config):\n    return None\n",
                  r"task name 'SST-2' is a built-in task \(sst-2\); registering mine by "
                  r"task_sst2 would replace it"),
    "format_float32": ("from tinybert_tf.export.formats import FORMATS, ExportFormat, "
                       "register_format\n"
                       "register_format(ExportFormat('float32', 'x.bin', None, None, 'mine')"
                       "{how_kw})\n",
                       r"export format 'float32' is already registered"),
}


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_a_plugin_cannot_silently_replace_a_built_in(registries, tmp_path, monkeypatch, name):
    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.plugins import PluginError
    code, pattern = PLUGINS[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{name}.py").write_text(code.format(how="", how_kw=""))
    argv = ["bin/distill", f"--output_dir={tmp_path / 'out'}", f"--plugins={name}"]
    with pytest.raises(PluginError, match=rf"^--plugins={name}: {pattern}.*replace=True"):
        parse_argv(argv)
    # Saying so replaces it.
    (tmp_path / f"{name}_ok.py").write_text(code.format(how="(replace=True)",
                                                        how_kw=", replace=True"))
    parse_argv(argv[:2] + [f"--plugins={name}_ok"])


def test_a_plugins_import_error_names_the_plugin_its_file_and_line(tmp_path, monkeypatch):
    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.plugins import PluginError
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "broken_syntax.py").write_text("x = 1\ndef f(:\n    pass\n")
    (tmp_path / "broken_import.py").write_text("import os\nvalue = {}['missing']\n")
    out = f"--output_dir={tmp_path / 'out'}"
    with pytest.raises(PluginError, match=r"^--plugins=broken_syntax: cannot import it: .*"
                       r"broken_syntax\.py, line 2: SyntaxError"):
        parse_argv(["bin/distill", out, "--plugins=broken_syntax"])
    with pytest.raises(PluginError, match=r"^--plugins=broken_import: cannot import it: .*"
                       r"broken_import\.py, line 2: KeyError: 'missing'; fix the plugin"):
        parse_argv(["bin/distill", out, "--plugins=broken_import"])


def test_a_plugin_that_calls_sys_exit_on_import_is_one_error_not_a_silent_exit(
        tmp_path, monkeypatch, capsys):
    from tinybert_tf.pipeline.main import main
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "exits_on_import.py").write_text("import sys\n\nsys.exit(3)\n")
    assert main(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                 "--plugins=exits_on_import", "--dry_run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.match(r"distill: error: --plugins=exits_on_import: importing it called "
                    r"sys\.exit\(3\) \(.*exits_on_import\.py, line 3\); a plugin module must "
                    r"only define and register its objects on import", err[0]), err[0]
    assert not os.path.exists(tmp_path / "out")


def test_a_duplicate_registration_of_an_object_is_one_short_line(registries, tmp_path,
                                                                  monkeypatch):
    """An instance (an export format, a stage) is named by its type and the line
    that registered it, not by its repr of hundreds of characters."""
    from tinybert_tf.pipeline.main import parse_argv
    from tinybert_tf.plugins import PluginError
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _ = PLUGINS["format_float32"]
    (tmp_path / "format_again.py").write_text(code.format(how="", how_kw=""))
    with pytest.raises(PluginError) as err:
        parse_argv(["bin/distill", f"--output_dir={tmp_path / 'out'}",
                    "--plugins=format_again"])
    message = str(err.value)
    assert "\n" not in message and len(message) < 300 + len(str(tmp_path)), message
    assert message == (
        "--plugins=format_again: export format 'float32' is already registered (a "
        "tinybert_tf.export.formats.ExportFormat); registering another ExportFormat at "
        f"{tmp_path / 'format_again.py'}, line 2 would replace it silently. Choose another "
        "name, or say it replaces the existing one (replace=True).")
    from tinybert_tf.pipeline.stages import Stage, register_stage
    with pytest.raises(PluginError) as err:
        register_stage(Stage("export", lambda ctx: {}))
    assert "<function" not in str(err.value) and len(str(err.value)) < 300 + len(__file__)
    assert "stage 'export' is already registered" in str(err.value)
    assert f"{__file__}, line" in str(err.value) and "replace=True" in str(err.value)


def test_a_plugin_terms_build_error_is_the_plugins_not_an_internal_error(
        registries, tmp_path, monkeypatch, tiny_vocab, capsys):
    from tinybert_tf.pipeline.main import main

    from pipeline_helpers import argv, tiny_flags, write_teacher
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "boom_term.py").write_text(
        "from tinybert_tf.distill import LossTerm, register_term\n\n\n"
        "@register_term\nclass Boom(LossTerm):\n    name = 'boom'\n\n"
        "    def build(self, student, teacher):\n"
        "        raise TypeError('needs a teacher with a pooler')\n")
    teacher = write_teacher(str(tmp_path / "task_teacher"), tiny_vocab, head="classifier")
    ns = tiny_flags(tmp_path, tiny_vocab, task_teacher=teacher, general_model="none",
                    use_augmented=False, stages=["task"], plugins=["boom_term"],
                    loss_terms=["attn", "boom"])
    assert main(["bin/distill", *argv(ns)]) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1, err
    assert re.search(r"^distill: error: --plugins=boom_term \(.*boom_term\.py, line 9, in "
                     r"build\): TypeError: needs a teacher with a pooler; fix the plugin", err)


@pytest.mark.parametrize("kind", ["phase", "recipe", "holdout"])
def test_registering_a_taken_name_is_refused_unless_it_says_it_replaces(kind):
    from tinybert_tf import plugins
    from tinybert_tf.data import holdout
    from tinybert_tf.pipeline.training import phases, recipes

    if kind == "holdout":
        holdout.register_holdout("_test_taken", lambda: frozenset({"A"}))
        with pytest.raises(plugins.PluginError, match="_test_taken.*replace=True"):
            holdout.register_holdout("_test_taken", _other_titles)
        holdout.register_holdout("_test_taken", _other_titles, replace=True)
        assert holdout.HOLDOUTS["_test_taken"] is _other_titles
        return
    base, register, table = {
        "phase": (phases.PHASE_KINDS["prediction"], phases.register_phase, phases.PHASE_KINDS),
        "recipe": (recipes.RECIPES["tinybert"], recipes.register_recipe, recipes.RECIPES),
    }[kind]
    original = type(base)
    impostor = type("Impostor", (original,), {"name": base.name, "__module__": "someone.else"})
    with pytest.raises(plugins.PluginError, match=f"{base.name}.*replace=True"):
        register(impostor)
    assert type(table[base.name]) is original  # the built-in is untouched
    try:
        register(replace=True)(impostor)
        assert type(table[base.name]) is impostor
    finally:
        register(replace=True)(original)
    assert type(table[base.name]) is original


def _other_titles() -> frozenset:
    return frozenset({"B"})

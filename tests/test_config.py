"""Config files and --key=value flags: applied in order, typed, and refused clearly when wrong."""
import glob
import os

import pytest

from conftest import REPO, assert_one_line_error, run_script
from config import ConfigError, load
from model import GPTConfig

DEFAULTS = {"batch_size": 12, "learning_rate": 6e-4, "compile": False, "dataset": "openwebtext",
            "kernels": "auto", "attn_dropout": -1.0}


def test_file_then_flags_in_order(tmp_path):
    path = tmp_path / "my.py"
    path.write_text("import math\n_helper = 3\nbatch_size = 4 * _helper\nlearning_rate = 1\ndataset = 'x'\n")
    config = load(DEFAULTS, [str(path), "--batch_size=5", "--compile=True", "--learning_rate=2e-3"])
    assert config["batch_size"] == 5                   # the flag came after the file
    assert config["learning_rate"] == 2e-3 and type(config["learning_rate"]) is float
    assert config["compile"] is True and config["dataset"] == "x"
    assert "math" not in config and "_helper" not in config
    assert DEFAULTS["batch_size"] == 12                # the defaults themselves are untouched


def test_int_float_in_file_becomes_float(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("learning_rate = 1\n")
    assert load(DEFAULTS, [str(path)])["learning_rate"] == 1.0


@pytest.mark.parametrize("text,expected", [("true", True), ("False", False), ("1", True), ("0", False)])
def test_bool_flags(text, expected):
    assert load(DEFAULTS, [f"--compile={text}"])["compile"] is expected


def test_int_flag_accepts_integral_float_only():
    assert load(DEFAULTS, ["--batch_size=1e2"])["batch_size"] == 100
    with pytest.raises(ConfigError, match=r"--batch_size: '0.5' is not a valid int"):
        load(DEFAULTS, ["--batch_size=0.5"])


def test_string_flag_is_taken_verbatim():
    assert load(DEFAULTS, ["--dataset=123"])["dataset"] == "123"


def test_unknown_flag_names_nearest_keys():
    with pytest.raises(ConfigError) as e:
        load(DEFAULTS, ["--batchsize=3"])
    assert "unknown config key 'batchsize'" in str(e.value) and "batch_size" in str(e.value)


def test_unknown_key_in_file_names_the_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("lerning_rate = 1e-3\n")
    with pytest.raises(ConfigError) as e:
        load(DEFAULTS, [str(path)])
    assert str(path) in str(e.value) and "learning_rate" in str(e.value)


@pytest.mark.parametrize("argv,fragment", [
    (["--batch_size=abc"], "not a valid int"),
    (["--compile=maybe"], "not a valid bool"),
    (["--learning_rate=fast"], "not a valid float"),
    (["--batch_size"], "has no value"),
    (["config/does_not_exist.py"], "not found"),
])
def test_bad_flags(argv, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load(DEFAULTS, argv)


def test_wrong_type_in_file(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("batch_size = '64'\n")
    with pytest.raises(ConfigError, match="batch_size = '64' is a str, but batch_size must be a int"):
        load(DEFAULTS, [str(path)])


def test_repo_configs_load_against_train_defaults():
    import train
    files = sorted(glob.glob(os.path.join(REPO, "config", "*.py")))
    files = [f for f in files if not f.endswith("__init__.py")]
    assert {os.path.basename(f) for f in files} >= {"shakespeare.py", "shakespeare_cpu.py", "gpt2.py"}
    for f in files:
        load(train.DEFAULTS, [f])
    baby = load(train.DEFAULTS, [os.path.join(REPO, "config", "shakespeare.py")])
    assert (baby["n_layer"], baby["n_head"], baby["n_embd"], baby["block_size"], baby["batch_size"]) == (6, 6, 384, 256, 64)
    assert (baby["max_iters"], baby["learning_rate"], baby["dropout"], baby["attn_dropout"]) == (5000, 1e-3, 0.2, 0.0)
    assert (baby["eval_interval"], baby["eval_iters"]) == (250, 200)


def test_attn_dropout_follows_dropout_unless_set():
    assert GPTConfig(dropout=0.2).attn_dropout == 0.2
    assert GPTConfig(dropout=0.2, attn_dropout=0.0).attn_dropout == 0.0


def test_cli_unknown_key_and_wrong_type_are_one_line():
    assert_one_line_error(run_script("train.py", "--lerning_rate=1e-3"), "lerning_rate", "learning_rate")
    assert_one_line_error(run_script("train.py", "--max_iters=lots"), "--max_iters", "not a valid int")
    assert_one_line_error(run_script("train.py", "--kernels=fast"), "kernels='fast'", "auto | tk | torch")
    assert_one_line_error(run_script("sample.py", "--top_k=many"), "--top_k")


def test_defaults_are_settings_only():
    import sample
    import train
    assert "CHECKPOINT_FORMAT" not in train.DEFAULTS and "HERE" not in train.DEFAULTS
    assert {"kernels", "kernels_attention", "kernels_layernorm", "kernels_mlp", "kernels_lm_head", "kernels_linear",
            "dropout", "attn_dropout", "init_from", "compile", "dtype", "device"} <= set(train.DEFAULTS)
    assert {"start", "num_samples", "max_new_tokens", "temperature", "top_k", "seed",
            "kernels"} <= set(sample.DEFAULTS)


def test_help_shows_each_settings_comment():
    from config import help_text, setting_comments
    source = ("# data\n"
              "batch_size = 12                  # sequences per micro-step\n"
              "compile = False                  # torch.compile the model, twice\n"
              "                                 # as slow to start\n"
              "# a section comment, not a setting's\n"
              "dataset = 'a # not a comment'\n")
    comments = setting_comments(source)
    assert comments == {"batch_size": "sequences per micro-step",
                        "compile": "torch.compile the model, twice as slow to start"}
    text = help_text("doc", {"batch_size": 12, "compile": False, "dataset": "x"}, source)
    assert text.splitlines()[2:] == ["  --batch_size=12  sequences per micro-step",
                                     "  --compile=False  torch.compile the model, twice as slow to start",
                                     "  --dataset='x'"]


def test_train_help_lists_the_settings_with_their_comments():
    result = run_script("train.py", "--help")
    assert result.returncode == 0
    line = next(l for l in result.stdout.splitlines() if l.strip().startswith("--ddp_bucket_cap_mb=25"))
    assert "buckets" in line and "config/gpt2.py sets 100" in line

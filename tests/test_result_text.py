"""A finished run as the lines `ffnlab train` prints (ffnlab.run.result_text)."""

from ffnlab.run.result_text import format_run
from tests.conftest import run_result


def test_a_language_model_run_in_a_few_lines():
    result = run_result(
        history={"val": [{"step": 0, "loss": 4.5}]}, learned={"blocks.0": {"beta": 1.5}}, cuda_peak_bytes=2**21
    )
    lines = format_run(result).splitlines()
    assert lines[0].startswith("gelu: finished after 10 steps, val loss 2.0000 (step 0: 4.5000), 16,000 params")
    assert lines[1] == "  perplexity 7.39, test loss 2.0000, with embedding noise -"  # not measured: a dash
    assert lines[2].startswith("  memory 1.2 MiB (params 0.1,") and lines[2].endswith(", CUDA peak 2.0 MiB")
    assert lines[-1] == '  learned blocks.0: {"beta": 1.5}'


def test_a_classifier_run_shows_its_accuracy_and_macro_f1():
    result = run_result(task="cls", final_val_acc=0.75, noisy_val_acc=0.5, final_val_macro_f1=0.6, history={"val": []})
    lines = format_run(result).splitlines()
    assert "(step" not in lines[0]
    assert lines[1] == "  accuracy 0.7500, test -, with embedding noise 0.5000; macro-F1 0.6000, test -"


def test_a_word_level_run_says_its_perplexity_is_per_word():
    for tokenizer, line in (("word", "  perplexity per word 7.39,"), ("bpe", "  perplexity 7.39,")):
        result = run_result(history={"val": []}, config={"tokenizer": tokenizer})
        assert format_run(result).splitlines()[1].startswith(line)

"""Fine-tuning a save_pretrained folder with its own tokenizer, for every task: tiny random BERT, GPT-2 and LLaMA
folders saved here with tokenizers trained here (WordPiece, byte-level BPE, BPE), the tokenizer's template, padding
and attention mask for cls and pairs, the first sub-token of each word labelled for tokens."""

import csv
import json
import pickle
import random

import pytest
import torch

from ffnlab.core.model import IGNORE_INDEX
from ffnlab.data.batches import PaddedSplit, eval_set, get_batch
from ffnlab.data.checkpoint_tokenizer import CheckpointTokenizer, read_checkpoint_tokenizer
from ffnlab.data.tokenizer import build_tokenizer, tokenizer_from_state
from ffnlab.tools.hf import model_inputs
from ffnlab.tools.pretrained import load_pretrained
from tests.conftest import assert_close

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "past", "houses", "under", "grey", "skies"]
NAMES, PLACES = ["Alice", "Bob", "Carol", "Dave"], ["Paris", "Rome", "Lisbon"]
SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, initializer_range=0.2)
CONTEXT = 32


def corpus_lines(n: int = 300) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS + NAMES + PLACES) for _ in range(rng.randint(5, 12))) + " ." for _ in range(n)]


# ---- tiny folders: a model and the tokenizer trained for it ----------------------------------------------


def wordpiece(lines: list[str]):
    """A BERT tokenizer: WordPiece with [PAD] [UNK] [CLS] [SEP] [MASK] and BERT's template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=90, special_tokens=specials))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tokenizer.decoder = decoders.WordPiece()
    return BertTokenizerFast(tokenizer_object=tokenizer)


def byte_level_bpe(lines: list[str]):
    """A GPT-2 tokenizer: byte-level BPE with <|endoftext|> (bos, eos and unk) and no pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GPT2TokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tokenizer.train_from_iterator(lines, trainer)
    end = "<|endoftext|>"
    return GPT2TokenizerFast(tokenizer_object=tokenizer, bos_token=end, eos_token=end, unk_token=end)


def llama_bpe(lines: list[str]):
    """A LLaMA tokenizer: BPE over '▁'-marked words with byte fallback, <unk> <s> </s>, <s> before each text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"]))
    return LlamaTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=True
    )


def save_folder(folder, model_class, config, tokenizer=None):
    """A random-init model saved with save_pretrained (safetensors), and its tokenizer beside it."""
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{'bert', 'gpt2', 'llama'}: tiny random folders with their tokenizers; GPT-2's as vocab.json and merges.txt
    only (what a fast tokenizer also reads), the others' as tokenizer.json and tokenizer_config.json."""
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    root, lines = tmp_path_factory.mktemp("folders"), corpus_lines()
    bert, gpt2, llama = wordpiece(lines), byte_level_bpe(lines), llama_bpe(lines)
    # BERT's embedding padded past the tokenizer (to a multiple of 8): the model's embedding decides
    bert_config = BertConfig(vocab_size=-(-len(bert) // 8) * 8, max_position_embeddings=64, **SHAPE)
    gpt2_config = GPT2Config(vocab_size=len(gpt2), n_positions=64, n_embd=32, n_layer=2, n_head=2, n_inner=64,
                             initializer_range=0.2, bos_token_id=gpt2.eos_token_id, eos_token_id=gpt2.eos_token_id)  # fmt: skip
    llama_config = LlamaConfig(vocab_size=len(llama), max_position_embeddings=64, num_key_value_heads=1, **SHAPE)
    out = {
        "bert": save_folder(root / "bert", BertForMaskedLM, bert_config, bert),
        "gpt2": save_folder(root / "gpt2", GPT2LMHeadModel, gpt2_config),
        "llama": save_folder(root / "llama", LlamaForCausalLM, llama_config, llama),
    }
    gpt2.backend_tokenizer.model.save(str(out["gpt2"]))  # vocab.json and merges.txt
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Tiny data: text for the LM, a CSV of one text and a label, a CSV of sentence pairs, CoNLL files of names
    and places."""
    root, rng = tmp_path_factory.mktemp("data"), random.Random(1)
    (root / "text.txt").write_text("\n".join(corpus_lines(400)) + "\n")
    rows = [
        {"text": line, "label": "named" if any(n in line for n in NAMES) else "plain"} for line in corpus_lines(120)
    ]
    write_csv(root / "cls.csv", rows, ("text", "label"))
    pairs = []
    for i in range(120):
        premise = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9)))
        word = rng.choice(WORDS)
        pairs.append({"premise": premise, "hypothesis": f"{word} {i}", "label": "yes" if word in premise else "no"})
    write_csv(root / "pairs.csv", pairs, ("premise", "hypothesis", "label"))
    (root / "conll").mkdir()
    for name, n in (("train.txt", 80), ("valid.txt", 20), ("test.txt", 20)):
        sentences = ["\n".join(f"{word} {tag}" for word, tag in tagged(rng)) for _ in range(n)]
        (root / "conll" / name).write_text("\n\n".join(sentences) + "\n")
    return root


def tagged(rng: random.Random) -> list[tuple[str, str]]:
    """A sentence of 3-8 words: a name (B-PER), a place (B-LOC, sometimes 'Lisbon Rome' as one: I-LOC) or filler."""
    words = []
    for _ in range(rng.randint(3, 8)):
        draw = rng.random()
        if draw < 0.2:
            words.append((rng.choice(NAMES), "B-PER"))
        elif draw < 0.35:
            words += [(rng.choice(PLACES), "B-LOC")] + ([("Rome", "I-LOC")] if rng.random() < 0.3 else [])
        else:
            words.append((rng.choice(WORDS), "O"))
    return words


def write_csv(path, rows, columns):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return path


# ---- the folder's tokenizer ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_the_folders_tokenizer_is_transformers_own_and_survives_its_state(folders, name):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(folders[name], local_files_only=True)
    tok = build_tokenizer("pretrained", [], folder=str(folders[name]))
    text = "Alice ran past the grey houses.\nBob sat  on a mat in Lisbon"
    assert isinstance(tok, CheckpointTokenizer) and tok.vocab_size == len(reference)
    assert tok.encode(text) == reference(text, add_special_tokens=False)["input_ids"]  # the LM's stream: no specials
    assert tok.pad_id == (reference.pad_token_id if name == "bert" else reference.eos_token_id)  # eos pads GPT-2, LLaMA
    again = tokenizer_from_state(json.loads(json.dumps(tok.state())))
    assert isinstance(again, CheckpointTokenizer) and again.state() == tok.state()
    pair = [("Alice ran past the grey houses", "the cat sat")]
    assert (
        again.encode_texts(pair, 12)
        == tok.encode_texts(pair, 12)
        == [reference(*pair[0], truncation=True, max_length=12)["input_ids"]]
    )


@pytest.mark.parametrize("name", ["bert", "llama"])
@pytest.mark.parametrize("context", [6, 9, 40])
def test_a_pair_is_the_tokenizers_template_truncated_longest_first(folders, name, context):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(folders[name], local_files_only=True)
    tok = read_checkpoint_tokenizer(str(folders[name]))
    pairs = [("the cat sat on a mat while dogs ran past", "Bob"), ("Alice", "grey skies under houses in Rome")]
    expected = [reference(a, b, truncation=True, max_length=context)["input_ids"] for a, b in pairs]
    assert tok.encode_texts(pairs, context) == expected
    if name == "bert":  # [CLS] a [SEP] b [SEP]
        cls, sep = reference.cls_token_id, reference.sep_token_id
        assert all(ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2 for ids in expected)
        assert tok.segment_sep_id == sep
    else:  # <s> a <s> b: no special token ends the first text, and LLaMA has no token types
        assert all(ids[0] == reference.bos_token_id for ids in expected) and tok.segment_sep_id is None


def hand_made_bert(folder):
    """A BERT tokenizer of a fixed vocabulary, so that a sentence's word pieces are known in advance."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertTokenizerFast

    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "eu", "re", "##ject", "##s", "german", "call", ".", "lamb"]
    tokenizer = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    BertTokenizerFast(tokenizer_object=tokenizer).save_pretrained(folder)
    return folder


def test_the_first_sub_token_of_each_word_carries_its_tag(tmp_path):
    from ffnlab.data.checkpoint_tokenizer import word_labels

    tok = read_checkpoint_tokenizer(str(hand_made_bert(tmp_path)))
    words = ["EU", "rejects", "German", "call", "Lamb."]  # 'Lamb.' is one word of the data, two pieces here
    tags = [3, 0, 2, 0, 1]  # B-ORG O B-MISC O B-PER, by id
    (ids,), (labels,) = word_labels(tok, [" ".join(words)], [tags], 16)
    #                   [CLS] eu  re  ##ject ##s german call lamb  .   [SEP]
    assert ids.tolist() == [2, 5, 6, 7, 8, 9, 10, 12, 11, 3]
    assert labels.tolist() == [IGNORE_INDEX, 3, 0, IGNORE_INDEX, IGNORE_INDEX, 2, 0, 1, IGNORE_INDEX, IGNORE_INDEX]
    # as transformers' token-classification example aligns them: word_ids() of the words, the first piece labelled
    from transformers import AutoTokenizer

    word_ids = AutoTokenizer.from_pretrained(tmp_path)(words, is_split_into_words=True).word_ids()
    firsts = [i is not None and i != word_ids[k - 1] for k, i in enumerate(word_ids)]
    assert labels.tolist() == [tags[i] if first else IGNORE_INDEX for i, first in zip(word_ids, firsts)]
    _, (cut,) = word_labels(tok, [" ".join(words)], [tags], 6)  # truncated: the words cut off carry no label
    assert cut.tolist() == [IGNORE_INDEX, 3, 0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_words_align_for_byte_level_and_metaspace_tokenizers_too(folders, name):
    tok = read_checkpoint_tokenizer(str(folders[name]))
    words = ["Alice", "ran", "past", "Lisbon", "skies", "."]
    ((ids, starts),) = tok.encode_words([words], CONTEXT)
    assert ids == tok.encode_texts([" ".join(words)], CONTEXT)[0]  # the sentence as the model reads running text
    assert [w for w in starts if w is not None] == list(range(len(words)))  # each word's first token, in order
    pieces = [tok.decode([i]) for i in ids]
    for word, start in zip(words, [k for k, w in enumerate(starts) if w is not None]):
        assert word.startswith(pieces[start].strip())


# ---- the model reads the padded examples -------------------------------------------------------------


def test_token_types_and_mask_are_the_tokenizers(folders):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(folders["bert"], local_files_only=True)
    tok = read_checkpoint_tokenizer(str(folders["bert"]))
    pairs = [("the cat sat on a mat", "Bob ran"), ("Alice", "grey skies under houses in Rome while dogs ran")]
    split = PaddedSplit([torch.tensor(ids) for ids in tok.encode_texts(pairs, 16)], torch.tensor([0, 1]), tok.pad_id)
    ((x, _),) = eval_set(split, "cls", 1, 2, 16)
    expected = reference([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=16,
                         padding="max_length", return_tensors="pt")  # fmt: skip
    inputs = model_inputs(x, tok.pad_id, tok.segment_sep_id)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(inputs[key], expected[key]), key


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_a_padded_example_gives_the_logits_of_the_unpadded_one(folders, name):
    tok = read_checkpoint_tokenizer(str(folders[name]))
    model = load_pretrained(folders[name], pretrained_ffn_of(name), "cls", 3, tok.vocab_size, 24, tok).eval()
    assert model.hf.config.pad_token_id == tok.pad_id  # the last-token classifiers (GPT-2, LLaMA) find it by it
    pairs = [("Alice ran past the houses", "the cat"), ("grey skies", "dogs ran past a mat in Rome")]
    examples = [torch.tensor(ids) for ids in tok.encode_texts(pairs, 24)]
    split = PaddedSplit(examples, torch.tensor([0, 1]), tok.pad_id)
    ((x, _),) = eval_set(split, "cls", 1, 2, 24)
    assert (x == tok.pad_id).any(dim=1).all()  # both padded
    with torch.no_grad():
        batch = model(x)[0]
        alone = torch.cat([model(ids[None])[0] for ids in examples])
    assert_close(batch, alone, atol=1e-5, rtol=1e-5)


def pretrained_ffn_of(name: str) -> str:
    return {"bert": "gelu", "gpt2": "gelu_new", "llama": "swiglu"}[name]


def test_batches_pad_and_never_repeat_the_folders_examples(folders):
    tok = read_checkpoint_tokenizer(str(folders["bert"]))
    examples = [torch.tensor(ids) for ids in tok.encode_texts(["the cat", "Alice ran past the grey houses"], 12)]
    split = PaddedSplit(examples, torch.tensor([1, 0]), tok.pad_id)
    x, y = get_batch(split, "cls", 8, 12, torch.Generator().manual_seed(0))
    for row, label in zip(x, y):
        ids = examples[1 - int(label)]
        assert row[: len(ids)].tolist() == ids.tolist() and (row[len(ids) :] == tok.pad_id).all()
    again = pickle.loads(pickle.dumps(split))
    assert isinstance(again, PaddedSplit) and again.pad_id == tok.pad_id and len(again) == 2


# ---- through the CLI: each task, the activation kept and swapped ---------------------------------------

QUICK = ["--seeds", 1, "--steps", 2, "--batch-size", 4, "--eval-batches", 1, "--final-eval-batches", 1,
         "--precision", "fp32", "--jobs", 1, "--no-stats", "--no-report", "--json"]  # fmt: skip
CASES = {  # name: (folder, the swap compared with keeping its activation, task flags)
    "bert cls": ("bert", "silu", ["--task", "cls", "--data", "cls.csv"]),
    "bert pairs": ("bert", "relu", ["--task", "cls", "--data", "pairs.csv", "--text-field", "premise,hypothesis"]),
    "bert tokens": ("bert", "silu", ["--task", "tokens", "--data", "conll"]),
    "gpt2 lm": ("gpt2", "relu", ["--data", "text.txt", "--context", CONTEXT]),
    "llama lm": ("llama", "reglu", ["--data", "text.txt", "--context", CONTEXT]),
}


@pytest.mark.parametrize("case", CASES)
def test_compare_from_a_folder_keeps_and_swaps_with_its_own_tokenizer(folders, data, run_cli, tmp_path, case):
    name, swap, flags = CASES[case]
    flags = [data / f if i and flags[i - 1] == "--data" else f for i, f in enumerate(flags)]
    store = tmp_path / "runs.db"
    code, out, err = run_cli("compare", "--from", folders[name], "--variants", swap, *flags, *QUICK, "--store", store)
    assert code == 0, err
    settings = json.loads(out)["settings"]
    assert settings["variants"] == [pretrained_ffn_of(name), swap]
    from ffnlab.study.store import Store

    with Store(store, read_only=True) as runs:
        records = [r for r in runs.runs() if r.done]
    assert sorted(r.config["model"]["ffn"] for r in records) == sorted([pretrained_ffn_of(name), swap])
    for record in records:
        assert record.config["tokenizer"] == "pretrained"
        assert record.config["special_tokens"] == ("lm" not in case)
        assert record.result.status == "finished" and record.result.val.loss is not None


def test_a_tagger_is_scored_once_per_word_not_per_sub_token(folders, data):
    """The loss, token accuracy and span F1 of `evaluate` read the labelled positions: each word's first sub-token."""
    import contextlib

    from ffnlab.core.model import ModelConfig
    from ffnlab.data.load import load_data
    from ffnlab.run.config import TrainConfig
    from ffnlab.run.train import data_args, evaluate

    cfg = TrainConfig(model=ModelConfig(task="tokens", ffn="gelu", context=CONTEXT), init_from=str(folders["bert"]),
                      data=str(data / "conll"))  # fmt: skip
    corpus, _, splits = load_data(*data_args(cfg))
    ids, labels = splits["val"]
    words = [len(doc.split(" ")) for doc in corpus.documents("val")]
    assert [int((y != IGNORE_INDEX).sum()) for y in labels] == words  # one label per word
    assert sum(len(x) for x in ids) > sum(words) + 2 * len(words)  # more tokens than words and specials: pieces
    batches = eval_set(splits["val"], "tokens", 4, 8, CONTEXT)
    n_tags = len(corpus.classes)

    class Oracle(torch.nn.Module):  # right at every labelled position, wrong at every other
        def forward(self, x, y):
            right = torch.nn.functional.one_hot(y.clamp(min=0), n_tags).float()
            wrong = torch.nn.functional.one_hot((y.clamp(min=0) + 1) % n_tags, n_tags).float()
            return torch.where((y == IGNORE_INDEX)[..., None], wrong, right), torch.zeros(())

    scores = evaluate(Oracle(), batches, "tokens", contextlib.nullcontext, tags=corpus.classes)
    assert scores["acc"] == 1.0 and scores["f1"] == 1.0


# ---- one-line errors --------------------------------------------------------------------------------


def test_what_does_not_fit_is_one_line(folders, data, run_cli, tmp_path):
    import shutil

    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    bare = tmp_path / "bare"  # the weights without their tokenizer
    shutil.copytree(folders["bert"], bare, ignore=shutil.ignore_patterns("tokenizer*"))
    grown = tmp_path / "grown"  # a tokenizer with more tokens than the model's embedding has rows
    shutil.copytree(folders["gpt2"], grown)
    tokenizer = AutoTokenizer.from_pretrained(grown)
    tokenizer.add_tokens([AddedToken(f"<new{i}>") for i in range(3)])
    tokenizer.save_pretrained(grown)
    steps = ["--steps", 1, "--batch-size", 2, "--precision", "fp32", "--quiet"]
    cases = [
        (["--from", bare, "--tokenizer", "pretrained", "--data", data / "text.txt"],
         f"{bare} has none (looked for tokenizer.json, vocab.txt, vocab.json with merges.txt)"),
        (["--from", bare, "--task", "tokens", "--data", data / "conll"], "has none (looked for tokenizer.json"),
        (["--from", grown, "--data", data / "text.txt", "--context", CONTEXT],
         f"the tokenizer of {grown} has ids up to {len(tokenizer) - 1} (its added tokens included), past the "
         f"{len(tokenizer) - 3} rows of the model's embedding"),
        (["--from", folders["bert"], "--data", data / "pairs.csv", "--text-field", "premise,hypothesis"],
         "a sentence pair (text_field 'premise,hypothesis') is for task cls, not lm"),
        (["--from", bare, "--task", "cls", "--data", data / "pairs.csv", "--text-field", "premise,hypothesis"],
         "is joined by the template of the folder's own tokenizer (--tokenizer pretrained); 'char' would add"),
        (["--from", folders["bert"], "--task", "cls", "--data", data / "pairs.csv", "--text-field",
          "premise,hypothesis", "--context", 4],
         "context 4 is too short for the template of the tokenizer of"),
    ]  # fmt: skip
    for flags, message in cases:
        code, out, err = run_cli("finetune", *flags, *steps)
        assert code == 2 and err.count("\n") == 1 and message in err, (flags, err)


def test_the_folders_tokenizer_is_the_default_whatever_files_hold_it(folders, run_cli):
    for name in ("bert", "gpt2", "llama"):  # tokenizer.json; GPT-2's vocab.json and merges.txt
        code, out, err = run_cli("finetune", "--from", folders[name], "--task", "cls", "--print-config")
        assert code == 0 and 'tokenizer = "pretrained"' in out, err
        assert "special_tokens" not in out  # set from the tokenizer and task, never read from a file


def test_examples_with_special_tokens_are_another_run_than_cropped_ones_but_an_lm_keeps_its_id(folders):
    """cls with the folder's tokenizer was cropped or repeated without special tokens: those stored runs are stale
    now (another id), while a language model's stream, which did not change, keeps its id."""
    from ffnlab.core.model import ModelConfig
    from ffnlab.run.config import TrainConfig, identity
    from ffnlab.study.plan import run_id

    folder = str(folders["bert"])
    lm = TrainConfig(init_from=folder, tokenizer="pretrained")
    cls = TrainConfig(model=ModelConfig(task="cls"), init_from=folder, tokenizer="pretrained")
    assert not lm.special_tokens and "special_tokens" not in identity(lm)
    assert cls.special_tokens and identity(cls)["special_tokens"] is True
    before = TrainConfig(model=ModelConfig(task="cls"), init_from=folder, tokenizer="pretrained")
    before.special_tokens = False  # what a run stored before had: no such field, its default
    assert run_id(before) != run_id(cls)
    assert run_id(TrainConfig.from_dict({**cls.to_dict(), "special_tokens": False})) == run_id(cls)  # set, not read


def test_glue_pairs_and_scores_with_the_folders_tokenizer(folders, run_cli, tmp_path):
    """MNLI (a pair, its mismatched dev set a further test set) and STS-B (a pair and a number) from a BERT folder."""
    from tests.test_glue import glue_rows, write_glue_tsv

    root = write_glue_tsv(tmp_path / "glue", glue_rows())
    for task, metric in (("mnli", "final_test_mismatched_acc"), ("stsb", "final_val_pearson")):
        code, out, err = run_cli("finetune", "--from", folders["bert"], "--data", f"glue:{root}:{task}", "--steps", 2,
                                 "--batch-size", 4, "--precision", "fp32", "--quiet", "--out", tmp_path / "r.json")  # fmt: skip
        assert code == 0, err
        result = json.loads((tmp_path / "r.json").read_text())
        assert result["config"]["special_tokens"] and result["status"] == "finished"
        assert result[metric] is not None, task

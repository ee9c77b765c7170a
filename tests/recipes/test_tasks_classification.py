"""GLUE-style preprocessing: columns (incl. GLUE's original file layouts), label sets and label checks,
metrics, prediction files, and the local-file loader."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from transformers import EvalPrediction

from bitfit_hf.recipe_kit import RecipeError
from bitfit_hf.recipe_kit.data import load_data_file, load_raw_datasets, read_tsv, require_split, select_samples
from bitfit_hf.recipe_kit.tasks.classification import (
    LabelSpec,
    canonicalize_glue_columns,
    constant_loss,
    encode_labels,
    get_task,
    is_fully_labelled,
    make_compute_metrics,
    read_glue_native,
    resolve_label_spec,
    resolve_text_columns,
    write_predictions,
)


def ds(**columns):
    return datasets.Dataset.from_dict(columns)


def test_task_lookup():
    assert get_task("SST-2").name == "sst2"
    assert get_task("sts-b").is_regression
    assert get_task(None) is None
    with pytest.raises(RecipeError, match="unknown task 'sst3'.*cola"):
        get_task("sst3")


def test_glue_label_names_and_ids():
    spec = resolve_label_spec({}, get_task("mnli"), "label")
    assert spec.names == ["entailment", "neutral", "contradiction"] and spec.num_labels == 3
    data = ds(premise=["a", "b", "c"], hypothesis=["x", "y", "z"], label=["neutral", "contradiction", "entailment"])
    out = encode_labels(data, "train", "label", spec)
    assert out["label"] == [1, 2, 0]
    data = ds(premise=["a", "b"], hypothesis=["x", "y"], label=["2", "0"])
    assert encode_labels(data, "train", "label", spec)["label"] == [2, 0]


def test_label_outside_the_label_set_is_an_error():
    spec = resolve_label_spec({}, get_task("sst2"), "label")
    data = ds(sentence=["good", "bad", "meh"], label=[1, 0, 2])
    with pytest.raises(RecipeError, match=r"'validation' split has 1 label\(s\) outside the label set \(row 2: 2\)"):
        encode_labels(data, "validation", "label", spec)
    data = ds(sentence=["good"], label=["maybe"])
    with pytest.raises(RecipeError, match="outside the label set.*'maybe'"):
        encode_labels(data, "train", "label", spec)


def test_unlabelled_test_split_is_allowed_only_for_prediction():
    spec = resolve_label_spec({}, get_task("rte"), "label")
    data = ds(sentence1=["a"], sentence2=["b"], label=[-1])
    assert encode_labels(data, "test", "label", spec, allow_unlabeled=True)["label"] == [-1]
    with pytest.raises(RecipeError):
        encode_labels(data, "train", "label", spec)


def test_fully_labelled():
    spec = LabelSpec(["a", "b"])
    assert is_fully_labelled(ds(label=[0, 1]), spec)
    assert not is_fully_labelled(ds(label=[0, -1]), spec)
    assert not is_fully_labelled(ds(text=["x"]), spec)
    assert not is_fully_labelled(ds(label=[0.5, float("nan")]), LabelSpec([], is_regression=True))


def test_custom_label_set_from_training_data():
    raw = {"train": ds(text=["a", "b", "c"], label=["pos", "neg", "pos"])}
    spec = resolve_label_spec(raw, None, "label")
    assert spec.names == ["neg", "pos"]
    assert encode_labels(raw["train"], "train", "label", spec)["label"] == [1, 0, 1]
    with pytest.raises(RecipeError, match="outside the label set"):
        encode_labels(ds(text=["d"], label=["neutral"]), "validation", "label", spec)
    regression = resolve_label_spec({"train": ds(text=["a", "b"], score=[0.5, 4.2])}, None, "score")
    assert regression.is_regression and regression.num_labels == 1
    with pytest.raises(RecipeError, match="at least two"):
        resolve_label_spec({"train": ds(text=["a", "b"], label=[1, 1])}, None, "label")


def test_missing_label_column_is_an_error():
    spec = LabelSpec(["a", "b"])
    with pytest.raises(RecipeError, match="no label column 'label'.*sentence"):
        encode_labels(ds(sentence=["x"]), "train", "label", spec)


def test_text_columns():
    data = ds(sentence1=["a"], sentence2=["b"], label=[0])
    assert resolve_text_columns(data, "train", get_task("rte"), None, "label") == ("sentence1", "sentence2")
    assert resolve_text_columns(data, "train", None, None, "label") == ("sentence1", "sentence2")
    assert resolve_text_columns(data, "train", None, "sentence2", "label") == ("sentence2", None)
    with pytest.raises(RecipeError, match=r"no column 'question'.*task qnli needs question, sentence"):
        resolve_text_columns(data, "train", get_task("qnli"), None, "label")
    assert resolve_text_columns(ds(review=["x"], stars=[1]), "train", None, None, "stars") == ("review", None)


def test_glue_original_files(tmp_path):
    cola = tmp_path / "cola_train.tsv"
    cola.write_text('gj04\t1\t\tOur friends won\'t buy this analysis, let alone the next one we propose.\n'
                    'gj04\t0\t*\tThey drank the pub "dry.\n')
    data = read_glue_native(str(cola), get_task("cola"))
    assert data.column_names == ["source", "label", "original_label", "sentence"]
    assert data["label"] == [1, 0] and data["sentence"][1] == 'They drank the pub "dry.'
    mrpc = tmp_path / "msr_paraphrase_train.txt"
    mrpc.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t702876\t702977\tAmrozi accused.\tReferring to him.\n")
    data = canonicalize_glue_columns(read_glue_native(str(mrpc), get_task("mrpc")), get_task("mrpc"))
    assert {"sentence1", "sentence2", "label"} <= set(data.column_names) and data["label"] == [1]
    mnli = tmp_path / "dev_matched.tsv"
    mnli.write_text("index\tsentence1\tsentence2\tgold_label\n0\tThe cat sat.\tA cat sat.\tentailment\n")
    data = canonicalize_glue_columns(load_data_file(str(mnli), "validation"), get_task("mnli"))
    assert {"premise", "hypothesis", "label"} <= set(data.column_names)
    assert read_glue_native(str(tmp_path / "x.csv"), None) is None


def test_tsv_with_a_bad_row(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_text("sentence\tlabel\nfine\t1\ntoo\tmany\tfields\n")
    with pytest.raises(RecipeError, match=r"bad.tsv:3: 3 tab-separated fields, but the header has 2"):
        read_tsv(str(path))


def test_local_files_and_split_checks(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood,1\nbad,0\n")
    empty = tmp_path / "dev.csv"
    empty.write_text("sentence,label\n")

    class Args:
        dataset_name = dataset_config_name = None
        train_file, validation_file, test_file = str(train), str(empty), None

    with pytest.raises(RecipeError, match="dev.csv' holds no examples"):
        load_raw_datasets(Args())
    Args.validation_file = None
    raw = load_raw_datasets(Args())
    assert len(raw["train"]) == 2
    raw["validation"] = raw["train"].select([])
    with pytest.raises(RecipeError, match="'validation' split is empty"):
        require_split(raw, "validation", "--do_eval", "--validation_file")
    with pytest.raises(RecipeError, match="needs a 'test' split.*--test_file"):
        require_split(raw, "test", "--do_predict", "--test_file")
    with pytest.raises(RecipeError, match="no such file"):
        load_data_file(str(tmp_path / "missing.csv"), "train")
    with pytest.raises(RecipeError, match="unsupported file type '.xlsx'"):
        (tmp_path / "a.xlsx").write_text("x")
        load_data_file(str(tmp_path / "a.xlsx"), "train")
    assert len(select_samples(raw["train"], 1, "train")) == 1
    assert len(select_samples(raw["train"], -1, "train")) == 2


def test_metrics_match_the_official_definitions():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    labels = np.array([0, 1, 0, 0])
    out = make_compute_metrics(get_task("mrpc"), False)(EvalPrediction(predictions=logits, label_ids=labels))
    assert out["accuracy"] == 0.75
    assert out["f1"] == pytest.approx(2 * 1 / (2 * 1 + 1 + 0))  # TP=1, FP=1, FN=0
    cola = make_compute_metrics(get_task("cola"), False)(EvalPrediction(predictions=logits, label_ids=labels))
    assert cola["matthews_correlation"] == pytest.approx(0.5773502691896258)  # sklearn's value
    preds = np.array([[0.1], [0.4], [0.35], [0.8]])
    stsb = make_compute_metrics(get_task("stsb"), True)(EvalPrediction(predictions=preds, label_ids=np.array([0.0, 0.5, 0.4, 1.0])))
    assert stsb["pearson"] > 0.99 and stsb["spearmanr"] == pytest.approx(1.0)
    custom = make_compute_metrics(None, False)(EvalPrediction(predictions=logits, label_ids=labels))
    assert custom == {"accuracy": 0.75}


def test_prediction_file(tmp_path):
    """The label of each row is the answer bitfit-hf predict and the server give for the same logits."""
    import torch

    from bitfit_hf.inference.answers import classification_answer

    path = tmp_path / "predict_results_sst2.txt"
    logits = np.array([[-1.0, 2.0], [0.5, -0.5], [0.3, 0.3]], dtype=np.float32)
    spec = LabelSpec(["negative", "positive"])
    write_predictions(str(path), logits, spec)
    assert path.read_text() == "index\tprediction\n0\tpositive\n1\tnegative\n2\tnegative\n"  # a tie: the first
    served = [classification_answer(torch.tensor(row), spec.id2label, None)[0]["label"] for row in logits]
    assert path.read_text().splitlines()[1:] == [f"{i}\t{label}" for i, label in enumerate(served)]
    write_predictions(str(path), np.array([[1.23456]]), LabelSpec([], is_regression=True))
    assert path.read_text() == "index\tprediction\n0\t1.235\n"


def test_predict_split_scores_another_split(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood,1\nbad,0\nfine,1\n")
    test = tmp_path / "test.csv"
    test.write_text("sentence,label\nmeh,0\n")

    class Args:
        dataset_name = dataset_config_name = None
        train_file, validation_file, test_file = str(train), None, str(test)
        predict_split = "train"

    raw = load_raw_datasets(Args())
    assert raw["test"]["sentence"] == ["good", "bad", "fine"]  # --do_predict now scores training examples
    Args.predict_split = "validation"
    with pytest.raises(RecipeError, match="--predict_split validation: the data has no such split"):
        load_raw_datasets(Args())
    Args.predict_split = "test"
    assert load_raw_datasets(Args())["test"]["sentence"] == ["meh"]


def test_a_constant_prediction_is_called_out_with_the_majority_class_score(caplog):
    labels = np.array([1] * 53 + [0] * 47)
    constant = np.tile([0.2, 0.9], (100, 1))  # every example "positive": the run learned nothing
    with caplog.at_level("WARNING", logger="bitfit_hf.recipe_kit.tasks.classification"):
        out = make_compute_metrics(None, False)(EvalPrediction(predictions=constant, label_ids=labels))
    assert out == {"accuracy": 0.53}  # the metrics themselves are unchanged
    [record] = [r for r in caplog.records if "same class" in r.getMessage()]
    assert "all 100" in record.getMessage() and "majority class" in record.getMessage() and "53.0%" in record.getMessage()
    assert "--learning_rate" in record.getMessage()
    caplog.clear()
    varied = np.tile([0.2, 0.9], (100, 1))
    varied[:10] = [0.9, 0.2]
    with caplog.at_level("WARNING", logger="bitfit_hf.recipe_kit.tasks.classification"):
        make_compute_metrics(None, False)(EvalPrediction(predictions=varied, label_ids=labels))
        make_compute_metrics(None, False)(EvalPrediction(predictions=constant[:5], label_ids=labels[:5]))  # too few to say
    assert not [r for r in caplog.records if "same class" in r.getMessage()]


def test_constant_loss_is_what_a_collapsed_classifier_scores_in_training():
    """The collapse callback's level: the entropy of the training labels (unlabelled rows left out), or their
    variance for regression; nothing without labels."""
    import math

    level = constant_loss(ds(label=[0, 1, 1, 1, -1]), is_regression=False)
    assert level.value == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert level.source == "the entropy of the training labels"
    assert constant_loss(ds(label=[1.0, 2.0, 3.0]), is_regression=True).value == pytest.approx(2 / 3)
    assert constant_loss(ds(sentence=["a"]), is_regression=False) is None and constant_loss(None, False) is None

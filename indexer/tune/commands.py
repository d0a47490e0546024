"""The tuners' CLI commands, `tune`, `tune-reranker`, `tune-reader`, `tune-generator` and `tune-decline`, registered
on the indexer's app (`indexer/cli.py` calls `register`). The tuners themselves are imported when a command runs, so
`--help` and `build` do not load them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from indexer.root_lock import IndexRootLocked
from indexer.tune.generator_model import GeneratorTrainOptions
from indexer.tune.reader_model import ReaderTrainOptions
from indexer.tune.reranker_model import RerankTrainOptions
from indexer.tune.summaries import reader_summary, rerank_summary, tune_summary
from ragserve.config import IndexSettings
from ragserve.errors import RagError
from ragserve.logs import setup_cli_logging
from ragserve.read.folder import MIN_MAX_LENGTH

T = TypeVar("T")
_RERANK_TRAIN = RerankTrainOptions()  # the tune-reranker CLI's defaults are the trainer's
_READER_TRAIN = ReaderTrainOptions()  # and tune-reader's

# The same logging flags as `build` (indexer/cli.py).
_VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Also show third-party libraries' INFO lines on the console")
]
_LogFileOption = Annotated[
    Path | None,
    typer.Option(envvar="RAGSERVE_INDEXER_LOG_FILE", help="Also write every log line (third-party INFO too) here"),
]


def register(app: typer.Typer) -> None:
    """Add `tune`, `tune-reranker`, `tune-reader`, `tune-generator` and `tune-decline` to `app`."""
    app.command()(tune)
    app.command("tune-reranker")(tune_reranker)
    app.command("tune-reader")(tune_reader)
    app.command("tune-generator")(tune_generator)
    app.command("tune-decline")(tune_decline)


def tune_decline(
    train: Annotated[Path, typer.Argument(help="A SQuAD-format folder: corpus.jsonl and questions.jsonl")],
    out: Annotated[Path, typer.Option(help="The model's JSON (the server's: ragserve/request/decline_model.json)")],
    covered: Annotated[int, typer.Option(min=10, help="Covered questions asked per served article and fold")] = 60,
    signals: Annotated[str, typer.Option(help="The signals it weighs, comma-separated")] = "",
    work: Annotated[
        Path | None, typer.Option(help="Index and rows folder (default: a temporary one); it keeps rows.json")
    ] = None,
    rows_from: Annotated[
        Path | None, typer.Option("--rows", help="A rows.json of an earlier run: fit again without asking")
    ] = None,
    verbose: _VerboseOption = False,
    log_file: _LogFileOption = None,
) -> None:
    """Fit the decline before the generator: each article of TRAIN left out of the served corpus in
    turn, its questions "absent", the served articles' answerable ones "covered"."""
    from indexer.tune.decline import DEFAULT_SIGNALS, cross_validate, fit, write_model
    from indexer.tune.decline_data import leave_one_out_in, read_rows

    setup_cli_logging(verbose, log_file, own_default="WARNING")
    names = tuple(n.strip() for n in signals.split(",") if n.strip()) or DEFAULT_SIGNALS
    if rows_from is not None:
        rows = _run_tuner(lambda: read_rows(rows_from))
    else:
        rows = _run_tuner(lambda: leave_one_out_in(train, covered, work))
    model = _run_tuner(lambda: fit(rows, names))
    write_model(model, out)
    typer.echo(f"wrote {out}: {json.dumps(model['fitted_on'])}")
    for rate, held in cross_validate(rows, names, (0.02, 0.025, 0.03, 0.035, 0.04, 0.05)).items():
        typer.echo(f"false rate {rate}, each article left out of the fit: {json.dumps(held)}")


def tune(
    index: Annotated[Path | None, typer.Option(help="Index root (default: RAGSERVE_INDEX_PATH)")] = None,
    queries: Annotated[
        Path | None, typer.Option(help="BEIR queries.jsonl (with --qrels); none: pairs from the corpus")
    ] = None,
    qrels: Annotated[Path | None, typer.Option(help="BEIR qrels TSV: query-id, corpus-id, score")] = None,
    # Measured best on SciFact's held-back DEV queries (BENCHMARKS.md, "Tuning").
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training pairs")] = 2,
    batch_size: Annotated[int, typer.Option(min=2, help="Pairs per step (the in-batch negatives)")] = 16,
    lr: Annotated[float, typer.Option(min=1e-7, max=1e-2, help="AdamW learning rate")] = 2e-5,
    hard_negatives: Annotated[int, typer.Option(min=0, help="Mined hard negatives per pair")] = 1,
    positive: Annotated[
        str, typer.Option(help="With labels, a relevant document's chunk to learn: best (ranked highest) or first")
    ] = "best",
    fit_fraction: Annotated[float, typer.Option(min=0.05, max=0.5, help="Labelled queries held back to fit")] = 0.2,
    max_pairs: Annotated[int, typer.Option(min=4, help="Without labels: documents sampled for pairs")] = 1000,
    pairs: Annotated[
        str, typer.Option(help="Without labels: title (title -> body) or sentence (a sentence -> the rest)")
    ] = "title",
    checkpoint_every: Annotated[int, typer.Option(min=1, help="Checkpoint every N steps (and each epoch)")] = 20,
    work: Annotated[Path | None, typer.Option(help="Checkpoint folder (default: INDEX/.tune)")] = None,
    force: Annotated[bool, typer.Option(help="Publish even if held-back queries did not improve")] = False,
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
    verbose: _VerboseOption = False,
    log_file: _LogFileOption = None,
) -> None:
    """Tune the bi-encoder to the index's corpus and publish a re-embedded version that ships it.

    Resumable: run the same command again after an interruption and it continues from the last
    checkpoint."""
    from indexer.tune.embedder import TuneJob, run_tune
    from indexer.tune.embedder_model import TrainOptions

    setup_cli_logging(verbose, log_file, own_default="WARNING")
    _check_tune_flags(queries, qrels, positive, pairs)
    job = TuneJob(
        root=index or IndexSettings().path,
        queries=queries,
        qrels=qrels,
        work=work,
        hard_negatives=hard_negatives,
        positive_chunk="first" if positive == "first" else "best",  # checked above
        fit_fraction=fit_fraction,
        max_pairs=max_pairs,
        pairs="sentence" if pairs == "sentence" else "title",  # checked above
        force=force,
        progress=progress,
        train=TrainOptions(epochs=epochs, batch_size=batch_size, lr=lr, checkpoint_every=checkpoint_every),
    )
    report = _run_tuner(lambda: run_tune(job, say=typer.echo))
    typer.echo(tune_summary(report))


def tune_reranker(
    queries: Annotated[Path, typer.Option(help="BEIR queries.jsonl")],
    qrels: Annotated[Path, typer.Option(help="BEIR qrels TSV: query-id, corpus-id, score")],
    index: Annotated[Path | None, typer.Option(help="Index root (default: RAGSERVE_INDEX_PATH)")] = None,
    layers: Annotated[
        int, typer.Option(min=1, max=6, help="Transformer layers of the cross-encoder")
    ] = _RERANK_TRAIN.layers,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training groups")] = _RERANK_TRAIN.epochs,
    negatives: Annotated[int, typer.Option(min=1, help="Hard negatives per relevant chunk")] = 7,
    lr: Annotated[float, typer.Option(min=1e-7, max=1e-2, help="Encoder learning rate")] = _RERANK_TRAIN.lr,
    head_lr: Annotated[
        float, typer.Option(min=1e-7, max=1e-1, help="Learning rate of the fresh head")
    ] = _RERANK_TRAIN.head_lr,
    fit_fraction: Annotated[float, typer.Option(min=0.05, max=0.5, help="Labelled queries held back to fit")] = 0.2,
    min_gain: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Held-back nDCG@10 gain needed to rerank by default")
    ] = 0.005,
    work: Annotated[Path | None, typer.Option(help="Checkpoint folder (default: INDEX/.tune-reranker)")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
    verbose: _VerboseOption = False,
    log_file: _LogFileOption = None,
) -> None:
    """Train a cross-encoder on the index's corpus and publish a version that ships it.

    The blend weight with the fused order is fitted on held-back queries; the server reranks with
    it by default (RAGSERVE_RERANK_MODE=auto) only if it beat the fused order there. Resumable."""
    from indexer.tune.reranker import RerankTuneJob, run_tune_reranker

    setup_cli_logging(verbose, log_file, own_default="WARNING")
    job = RerankTuneJob(
        root=index or IndexSettings().path,
        queries=queries,
        qrels=qrels,
        negatives=negatives,
        fit_fraction=fit_fraction,
        min_gain=min_gain,
        work=work,
        progress=progress,
        train=RerankTrainOptions(layers=layers, epochs=epochs, lr=lr, head_lr=head_lr),
    )
    report = _run_tuner(lambda: run_tune_reranker(job, say=typer.echo))
    typer.echo(rerank_summary(report))


def tune_reader(
    train: Annotated[Path, typer.Option(help="SQuAD-format folder to train on (corpus.jsonl, questions.jsonl)")],
    base: Annotated[
        str, typer.Option(help="Base weights: an HF id or local folder of a BERT model; default: all-MiniLM-L6-v2")
    ],
    out: Annotated[
        Path, typer.Option(help="Reader folder to write (a reader folder there is replaced; any other files: refused)")
    ],
    dev: Annotated[
        Path | None, typer.Option(help="Held-out SQuAD-format folder: figures and the no-answer threshold")
    ] = None,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the training examples")] = _READER_TRAIN.epochs,
    batch_size: Annotated[int, typer.Option(min=1, help="Examples per step")] = _READER_TRAIN.batch_size,
    lr: Annotated[float, typer.Option(min=1e-7, max=1e-2, help="AdamW learning rate")] = _READER_TRAIN.lr,
    max_seconds: Annotated[
        float | None, typer.Option(min=1.0, help="Stop training after this long (the schedule is fitted to it)")
    ] = None,
    max_steps: Annotated[int | None, typer.Option(min=1, help="Stop training after this many steps")] = None,
    train_length: Annotated[
        int, typer.Option(min=32, max=512, help="Tokens per training pair")
    ] = _READER_TRAIN.max_length,
    max_length: Annotated[int, typer.Option(min=MIN_MAX_LENGTH, max=512, help="Tokens per pair when serving")] = 256,
    negative_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Answerable questions also asked of another paragraph")
    ] = 0.3,
    decline_answerable: Annotated[
        float, typer.Option(min=0.0, max=0.5, help="Held-out answerable share the threshold may decline")
    ] = 0.10,
    name: Annotated[str, typer.Option(help="The reader's name (its model id is name+digest)")] = "ragserve-reader",
    seed: Annotated[int, typer.Option(help="Seed of the shuffles and the fresh head")] = _READER_TRAIN.seed,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    verbose: _VerboseOption = False,
    log_file: _LogFileOption = None,
) -> None:
    """Train an extractive reader (span head, SQuAD 2.0 style) and write it as an ONNX int8 reader folder.

    Answerable questions teach their gold span; unanswerable ones, and answerable ones asked of
    another paragraph, teach "no answer". With --dev, the folder's manifest records held-out
    figures and the no-answer threshold chosen there."""
    from indexer.tune.reader import ReaderTuneJob, run_tune_reader

    setup_cli_logging(verbose, log_file, own_default="WARNING")
    job = ReaderTuneJob(
        train=train,
        base=base,
        out=out,
        dev=dev,
        name=name,
        negative_share=negative_share,
        decline_answerable=decline_answerable,
        max_length=max_length,
        progress=progress,
        training=_reader_training(epochs, batch_size, lr, train_length, max_seconds, max_steps, seed),
    )
    report = _run_tuner(lambda: run_tune_reader(job, say=typer.echo))
    typer.echo(reader_summary(report))


def _reader_training(
    epochs: int, batch_size: int, lr: float, length: int, max_seconds: float | None, max_steps: int | None, seed: int
) -> ReaderTrainOptions:
    """`tune-reader`'s training flags as the trainer takes them."""
    return ReaderTrainOptions(
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        max_length=length,
        max_seconds=max_seconds,
        max_steps=max_steps,
        seed=seed,
    )


_GEN_TRAIN = GeneratorTrainOptions()


def tune_generator(
    out: Annotated[Path, typer.Option(help="Adapter folder to write (RAGSERVE_GENERATOR_ADAPTER names it)")],
    train: Annotated[
        Path | None, typer.Option(help="SQuAD-format folder: make the training data from it (phase 1)")
    ] = None,
    data: Annotated[
        Path | None, typer.Option(help="Dataset folder phase 1 writes, or reads when --train is not given")
    ] = None,
    base: Annotated[
        str | None, typer.Option(help="Base model folder (default: the embedded default, without adapter)")
    ] = None,
    data_only: Annotated[bool, typer.Option(help="Stop after phase 1 (train elsewhere, e.g. on a GPU host)")] = False,
    epochs: Annotated[int, typer.Option(min=1)] = _GEN_TRAIN.epochs,
    batch_size: Annotated[int, typer.Option(min=1)] = _GEN_TRAIN.batch_size,
    lr: Annotated[float, typer.Option(min=1e-7, max=1e-1)] = _GEN_TRAIN.lr,
    rank: Annotated[int, typer.Option(min=1, help="LoRA rank (every linear layer)")] = _GEN_TRAIN.rank,
    missed_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of answerable-but-missed examples (declines) kept")
    ] = _GEN_TRAIN.missed_share,
    excluded_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of gold-paragraph-excluded examples (declines) added")
    ] = _GEN_TRAIN.excluded_share,
    max_steps: Annotated[int | None, typer.Option(min=1, help="A short run: the first N steps")] = None,
    heldout_share: Annotated[float, typer.Option(min=0.0, max=0.5, help="Paragraphs held out for figures")] = 0.05,
    name: Annotated[str, typer.Option(help="The adapter's name")] = "smollm2-squad2-grounded",
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
    verbose: _VerboseOption = False,
    log_file: _LogFileOption = None,
) -> None:
    """Train a LoRA adapter for the generator on SQuAD-format data, from the prompts Query serves.

    Phase 1 (--train) indexes the corpus, retrieves and fits every question as Query does and
    writes a token-id dataset; phase 2 trains (CUDA when present, else the CPU; resumable) and
    writes the adapter with its manifest. Phase 2 alone runs on a host with only torch,
    transformers and peft: python -m indexer.tune.generator_model --data DIR --base MODEL --out DIR."""
    from indexer.tune.generator_data import DataOptions, prepare_generator_data
    from indexer.tune.generator_model import train_adapter
    from ragserve.config import default_generator_path

    setup_cli_logging(verbose, log_file, own_default="WARNING")
    model = base or str(default_generator_path())
    folder = data or out.with_name(out.name + ".data")
    if train is None and data is None:
        typer.echo("error: give --train (make the data) or --data (a dataset phase 1 wrote)", err=True)
        raise typer.Exit(2)
    if train is not None:
        options = DataOptions(heldout_share=heldout_share)
        made = _run_tuner(lambda: prepare_generator_data(train, model, folder, options, progress, typer.echo))
        typer.echo(f"wrote {folder}: {made['examples']} examples, prompts {made['prompt_tokens_mean']} tokens mean")
    if data_only:
        return
    training = GeneratorTrainOptions(
        epochs=epochs, batch_size=batch_size, lr=lr, rank=rank, alpha=2 * rank, missed_share=missed_share,
        excluded_share=excluded_share, max_steps=max_steps,
    )  # fmt: skip
    manifest = _run_tuner(lambda: train_adapter(folder, model, out, training, name, progress=progress))
    heldout = {k: v for k, v in manifest["heldout"].items() if k != "examples"}
    typer.echo(f"wrote adapter {out}: {json.dumps(manifest['training'])}; held-out {json.dumps(heldout)}")


def _check_tune_flags(queries: Path | None, qrels: Path | None, positive: str, pairs: str) -> None:
    """`tune`'s flags that typer cannot check alone; a bad combination exits 2 with one line."""
    if (queries is None) != (qrels is None):
        typer.echo("error: give both --queries and --qrels (labelled), or neither (pairs from the corpus)", err=True)
        raise typer.Exit(2)
    if positive not in ("best", "first") or pairs not in ("title", "sentence"):
        typer.echo(
            f"error: --positive is best or first ({positive!r}), --pairs title or sentence ({pairs!r})", err=True
        )
        raise typer.Exit(2)


def _run_tuner(run: Callable[[], T]) -> T:
    """A tuner's run; bad input, a locked root or an unloadable index exit 2 with one line."""
    from indexer.tune.evaluation import TuneInputError

    try:
        return run()
    except (TuneInputError, RagError, ValueError, OSError, IndexRootLocked) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

"""Text in, text out with a model you have, on the project's ops in ExecuTorch:

    python -m my_ops.hf generate --model PATH --prompt "The capital of France is" [--chat] [--quantize gguf]
                                 [--max_new_tokens N] [--temperature T --top_k K --top_p P --seed S] [--verbose]
    python -m my_ops.hf export --model PATH [--quantize 8da4w] --output DIR [--ptd]
    python -m my_ops.hf perplexity --model PATH [--quantize 8da4w] [--text FILE] [--ctx N [--chunks K]]

PATH is a Hugging Face model folder or a llama.cpp GGUF file (--quantize gguf: the file's own tensors in the formats
llama-quantize writes, Q4_K_M and the other presets, nothing requantized). generate exports the model once (the
program is kept in a cache folder under a hash of the model, the precision and the sources; later runs reuse it),
decodes the prompt in ExecuTorch's Python runtime, prints the text as it forms and ends with the prefill time and
decode speed; the libraries' own messages are kept out of it unless --verbose. Greedy by default; --temperature
above 0 samples as llama.cpp does (top-k, then top-p, then the temperature; --seed repeats a text). export writes
model.pte beside the tokenizer.json that ExecuTorch's LLM runner (TextLLMRunner) reads (--ptd: the weights in
model.ptd beside it, ExecuTorch's named data file; runners take it as --data_path). perplexity scores a text (by
default the one shipped in the repository, examples/alice_chapter1.txt) with the program, beside the eager float32
model's: over windows of --window tokens, or with --ctx by llama-perplexity's protocol (chunks of --ctx tokens, the
second half of each scored, BOS first where the model adds one), the figure `llama-perplexity -c N` prints.

The ops come from a CMake build of the repository (--build_dir; in a checkout, cmake-out/all_ops), or PyTorch's side
from the installed my_ops wheel with the kernels from --kernel_library.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile

from . import session

PRECISIONS = {"none": None, "float32": None, "8da8w": "8da8w", "8da4w": "8da4w", "gguf": "gguf"}
DEFAULT_TEXT = os.path.join(session.CHECKOUT, "examples", "alice_chapter1.txt")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m my_ops.hf", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help)
        sub.add_argument("--model", required=True, help="a Hugging Face model folder or a llama.cpp .gguf file")
        sub.add_argument("--quantize", default="none", choices=list(PRECISIONS),
                         help="none (float32), 8da8w or 8da4w: 8- or 4-bit weights in blocks of 32, activations "
                              "quantized to 8 bits at run time; gguf: a .gguf file's own blocks as they are "
                              "(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants Q2_K to Q6_K, F32, F16, BF16)")
        sub.add_argument("--max_seq_len", type=int, default=512, help="positions the program holds (default 512)")
        sub.add_argument("--layers", type=int, default=None,
                         help="the model's first N blocks only: a quick check of the path through the ops (its text "
                              "is not the model's)")
        sub.add_argument("--build_dir", default=session.default_build_dir(),
                         help="a CMake build of the repository with every op (default: cmake-out/all_ops of this "
                              "checkout, when built)")
        return sub

    generate = command("generate", "decode a prompt in ExecuTorch, streaming the text")
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--chat", action="store_true", help="the prompt as a user's turn of the model's chat template")
    generate.add_argument("--max_new_tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0,
                          help="0 (default): greedy; above 0: sample at this temperature (llama.cpp's default is 0.8)")
    generate.add_argument("--top_k", type=int, default=40, help="sample from the k most likely tokens (0: all)")
    generate.add_argument("--top_p", type=float, default=0.95,
                          help="then from the fewest whose probabilities add up to p (1: all)")
    generate.add_argument("--seed", type=int, default=None, help="the sampler's seed: the same text for the same seed")
    generate.add_argument("--verbose", action="store_true",
                          help="show the libraries' own messages (ExecuTorch's, torch's) around the text")
    export = command("export", "write model.pte and tokenizer.json (TextLLMRunner's inputs) into --output")
    export.add_argument("--output", required=True, help="the folder to write into")
    export.add_argument("--ptd", action="store_true",
                        help="the weights in model.ptd beside model.pte (ExecuTorch's named data file, read with "
                             "the program: the runner's and TextLLMRunner's --data_path)")
    score = command("perplexity", "the perplexity of a text under the program, beside the eager float32 model's")
    score.add_argument("--text", default=DEFAULT_TEXT, help="a UTF-8 text file (default: %(default)s)")
    score.add_argument("--window", type=int, default=None, help="tokens per window (default: --max_seq_len)")
    score.add_argument("--ctx", type=int, default=None,
                       help="llama-perplexity's protocol instead: chunks of CTX tokens, the second half of each scored")
    score.add_argument("--chunks", type=int, default=None, help="with --ctx: score at most this many chunks")
    for sub in (generate, score):
        sub.add_argument("--kernel_library", default=None,
                         help="the ops' ExecuTorch kernels (default: --build_dir's libcustom_ops_lib.so)")
        sub.add_argument("--cache_dir", default=session.default_cache_dir(),
                         help="where exported programs are kept (default: $MY_OPS_CACHE_DIR or %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.max_seq_len < 2:
        print("error: --max_seq_len must be 2 or more", file=sys.stderr)
        return 2
    quiet = args.command == "generate" and not args.verbose
    try:
        with session.libraries_quiet(quiet) as log:
            try:
                return _run(args)
            except (OSError, ValueError, RuntimeError) as err:  # UnsupportedModelError is a ValueError
                session.say(f"error: {err}")
                if quiet:
                    session.say(f"(the libraries' messages are in {log}; --verbose shows them as they come)")
                raise _Failed from None
    except _Failed:
        return 1


class _Failed(Exception):
    """Ends the quiet block with an exception, so its log is kept for the user."""


def _run(args) -> int:
    quantize = PRECISIONS[args.quantize]
    session.register_ops(args.build_dir)
    from . import checkpoint as checkpoints

    # gguf runs the file's own tensors: no float32 model, except for perplexity, which scores it beside the program
    on_file_tensors = quantize == "gguf" and args.command != "perplexity"
    if not on_file_tensors and (gguf := checkpoints.gguf_file(args.model)) is not None:
        session.say(f"Loading {os.path.basename(gguf)} as a float32 model: "
                    f"{checkpoints.float32_bytes(gguf, args.layers) / 2 ** 30:.1f} GiB of memory"
                    + ("" if quantize == "gguf" else " (--quantize gguf exports the file's own tensors without it)"))
    if args.command == "export":
        os.makedirs(args.output, exist_ok=True)
        # a file's own tensors wait on disk beside the output as they are packed, the export holding them once
        with tempfile.TemporaryDirectory(dir=args.output, prefix=".weights-") as weights:
            checkpoint = checkpoints.load(args.model, layers=args.layers, dequantize=not on_file_tensors,
                                          weights_dir=weights if on_file_tensors else None, tokenizer=False)
            return _export(args, checkpoint, quantize)
    checkpoint = checkpoints.load(args.model, layers=args.layers, dequantize=not on_file_tensors)
    library = args.kernel_library or (os.path.join(args.build_dir, session.KERNEL_LIBRARY) if args.build_dir else None)
    if library is None:
        raise FileNotFoundError(f"no kernel library: {session.build_hint()} pass --build_dir or --kernel_library")
    session.load_kernels(library)
    return _generate(args, checkpoint, quantize) if args.command == "generate" else _perplexity(args, checkpoint,
                                                                                                 quantize)


def _export(args, checkpoint, quantize) -> int:
    from .to_program import export_checkpoint, write_program

    data_file = "model" if args.ptd else None
    program = export_checkpoint(checkpoint, max_seq_len=args.max_seq_len, quantize=quantize, data_file=data_file)
    written = write_program(program, os.path.join(args.output, "model.pte"), data_file)
    del program
    gc.collect()
    # the tokenizer only now, in the memory the export freed: a large vocabulary's would add to the export's peak
    from .checkpoint import save_tokenizer, tokenizer_of

    files = ", ".join(f"{path} ({os.path.getsize(path) / 2 ** 20:.1f} MiB)" for path in written)
    print(f"Wrote {files} and {save_tokenizer(tokenizer_of(checkpoint.path), args.output)}")
    return 0


def _program(args, checkpoint, quantize, *, announce_reuse: bool = True) -> str:
    def exporting() -> None:
        model = os.path.basename(checkpoint.path.rstrip("/"))
        session.say(f"Exporting the {quantize or 'float32'} program of {model} (once: it is kept in {args.cache_dir})")

    pte, made = session.export_cached(checkpoint, quantize, args.max_seq_len, args.cache_dir, on_export=exporting)
    if made or announce_reuse:
        session.say(f"{'Exported' if made else 'Reused'} {pte}")
    return pte


def _generate(args, checkpoint, quantize) -> int:
    from .text import generate, prompt_ids, sampler

    ids = prompt_ids(checkpoint.tokenizer, args.prompt, chat=args.chat)
    if len(ids) + args.max_new_tokens > args.max_seq_len:
        session.say(f"error: the prompt's {len(ids)} tokens and {args.max_new_tokens} new ones pass --max_seq_len "
                    f"{args.max_seq_len}; raise it or ask for fewer")
        return 2
    choose = sampler(args.temperature, args.top_k, args.top_p, args.seed)
    pte = _program(args, checkpoint, quantize, announce_reuse=args.verbose)
    program, method = session.load_method(pte)
    if not args.chat:
        print(args.prompt, end="", flush=True)
    result = generate(lambda t, p: method.execute([t, p])[0], checkpoint.tokenizer, ids, args.max_new_tokens,
                      checkpoint.stop_ids, on_text=lambda text: print(text, end="", flush=True), choose=choose)
    print(flush=True)
    session.say(f"Prefill: {len(ids)} tokens in {result.prefill_s * 1e3:.1f} ms; decode: {len(result.tokens) - 1} "
                f"tokens at {result.decode_tokens_per_s:.1f} tokens/s")
    del program
    return 0


def _perplexity(args, checkpoint, quantize) -> int:
    import copy

    from .text import chunked_perplexity, eager_chunked_perplexity, eager_perplexity, perplexity, perplexity_ids

    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    reference = copy.deepcopy(checkpoint.model)  # the export swaps the model in place
    if args.ctx is not None:
        if not 4 <= args.ctx <= args.max_seq_len:
            raise ValueError(f"--ctx {args.ctx}: give 4 to --max_seq_len ({args.max_seq_len}) tokens a chunk")
        bos = checkpoint.tokenizer.bos_token_id if checkpoint.add_bos else None
        ids = perplexity_ids(checkpoint.tokenizer, text, bos)  # the text as llama-perplexity tokenizes it
        eager, _ = eager_chunked_perplexity(reference, ids, args.ctx, args.chunks, bos)
        pte = _program(args, checkpoint, quantize)
        program, method = session.load_method(pte)
        value, scored = chunked_perplexity(lambda t, p: method.execute([t, p])[0], ids, args.ctx, args.chunks, bos)
        how = (f"{scored} tokens scored by llama-perplexity's protocol (chunks of {args.ctx}, the second half of each "
               f"scored; `llama-perplexity -c {args.ctx}"
               f"{'' if args.chunks is None else f' --chunks {args.chunks}'}` on the same file and text)")
    else:
        ids = perplexity_ids(checkpoint.tokenizer, text)
        window = args.window or args.max_seq_len
        eager, _ = eager_perplexity(reference, ids, window)
        pte = _program(args, checkpoint, quantize)
        program, method = session.load_method(pte)
        value, scored = perplexity(lambda t, p: method.execute([t, p])[0], ids, window)
        how = f"{scored} tokens scored in windows of {window}"
    print(f"{os.path.basename(args.text)}: {how}; perplexity {value:.4f} ({args.quantize} program in ExecuTorch), "
          f"{eager:.4f} (float32 in eager transformers), {100 * (value / eager - 1):+.2f}%")
    del program
    return 0


if __name__ == "__main__":
    sys.exit(main())

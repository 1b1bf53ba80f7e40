#!/usr/bin/env python3
"""make_seeds: writes the seed corpora of the fuzz targets whose inputs are binary.

    python3 fuzz/make_seeds.py        # from the repository root; needs protoc (Debian's)

Writes fuzz/corpus/{kv_control,nccl_frame,request_proto,llama2c_files,hf_config}/: valid
messages and files (so that mutations start deep inside the decoders) and the hostile shapes of
reliability.md C11/C12 (huge counts and lengths, overflowing dimensions, negative and
out-of-range values, truncations, overlapping or out-of-region offsets). Protobuf seeds are
written here in text format and encoded with `protoc --encode`; each seed starts with the
selector byte(s) its target reads (see the target's header comment). Regression seeds of fixed
findings are files of their own in those folders (named `regression_*`), not made here.
"""

import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
PROTO_DIR = os.path.join(ROOT, "proto")
U64_MAX = (1 << 64) - 1
I32_MAX = (1 << 31) - 1


def encode(message, text):
    """Serialized bytes of estuary.v1.<message> given in protobuf text format."""
    run = subprocess.run(
        ["protoc", f"--encode=estuary.v1.{message}", "-I", PROTO_DIR,
         os.path.join(PROTO_DIR, "estuary/v1/worker.proto")],
        input=text.encode(), stdout=subprocess.PIPE, check=True)
    return run.stdout


def write(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & U64_MAX
    return h


# --- kv_control: selector 0 = a completion message as received, 1 = a completion body framed by
# the target, 2 = a TransferDescriptor (then a prompt-length byte and a prefill-TP byte),
# 3 / 4 = an attach as received / its body, 5 / 6 = an attach reply as received / its body.

def completion_frame(body, magic=b"EKC1"):
    return magic + body + struct.pack("<Q", fnv1a64(body))


EPOCH = "reservation_epoch: 81985529216486895"  # 0x0123456789abcdef


# stories260K's KV format, as MakeFingerprint writes it.
FINGERPRINT = ('fingerprint { model_id: "stories260K" dtype: "f32" layout { n_layers: 5 '
               'n_kv_heads: 4 head_dim: 8 block_size: 16 dtype: "f32" } }')


def descriptor(tp=1, pages=(0, 1), region_bytes=1 << 20, heads=None, extra=""):
    heads = 4 // tp if heads is None else heads
    ranks = ""
    for r in range(tp):
        layers = " ".join(
            f'layers {{ base_address: {4096 * (l + 1)} bytes: {region_bytes} rkey: "k{l}" }}'
            for l in range(5))
        ranks += f"ranks {{ tp_rank: {r} {layers} }} "
    page_ids = " ".join(f"page_ids: {p}" for p in pages)
    return (f'transport: "ucx" worker_address: "decode-worker-address" request_id: "req-1" '
            f'{page_ids} layout {{ n_layers: 5 n_kv_heads: {heads} head_dim: 8 block_size: 16 '
            f'dtype: "f32" }} tp_size: {tp} {ranks} {FINGERPRINT} '
            f'lease_deadline_unix_ms: 1700000000000 {EPOCH} {extra}')


def kv_control():
    ok = encode("KvCompletion", 'request_id: "req-1" num_tokens: 3 first_token: 42 '
                                f'provenance: "\\377\\377\\002" {EPOCH}')
    write("kv_control", "completion_ok", b"\x00" + completion_frame(ok))
    write("kv_control", "completion_bad_checksum", b"\x00" + completion_frame(ok)[:-1] + b"\x00")
    write("kv_control", "completion_truncated", b"\x00" + completion_frame(ok)[:9])
    abort = encode("KvCompletion", 'request_id: "req-1" status_code: 10 '
                                   f'status_message: "prefill aborted" {EPOCH} late_put: true')
    write("kv_control", "completion_abort", b"\x00" + completion_frame(abort))
    write("kv_control", "body_logprobs", b"\x01" + encode(
        "KvCompletion", 'request_id: "req-2" num_tokens: 2 first_token: 7 provenance: "\\001\\377" '
                        'first_token_logprobs { logprob: -0.5 top { token_id: 7 logprob: -0.5 } '
                        f'top {{ token_id: 2147483647 logprob: -1e30 }} }} {EPOCH}'))
    write("kv_control", "body_zero_epoch", b"\x01" + encode(
        "KvCompletion", 'request_id: "x" num_tokens: 0'))
    digest = "\\" + "\\".join(f"{b:03o}" for b in range(32))  # a SHA-256's 32 bytes
    attach = encode("KvAttach", f'request_id: "req-1" {EPOCH} writer_address: "prefill-address" '
                                f'descriptor_digest: "{digest}"')
    write("kv_control", "attach_ok", b"\x03" + completion_frame(attach, b"EKA1"))
    write("kv_control", "attach_body", b"\x04" + attach)
    write("kv_control", "attach_short_digest", b"\x04" + encode(
        "KvAttach", f'request_id: "req-1" {EPOCH} writer_address: "w" descriptor_digest: "abc"'))
    write("kv_control", "attach_huge_address", b"\x04" + encode(
        "KvAttach", f'request_id: "req-1" {EPOCH} writer_address: "{"a" * 5000}"'))
    reply = encode("KvAttachReply", f'request_id: "req-1" {EPOCH} status_code: 0')
    write("kv_control", "reply_ok", b"\x05" + completion_frame(reply, b"EKR1"))
    write("kv_control", "reply_body_refused", b"\x06" + encode(
        "KvAttachReply", f'request_id: "req-1" {EPOCH} status_code: 9 '
                         'status_message: "another writer"'))
    write("kv_control", "body_huge_count", b"\x01" + encode(
        "KvCompletion", f'request_id: "x" num_tokens: {I32_MAX} provenance: "\\001"'))
    write("kv_control", "body_negative_count", b"\x01" + encode(
        "KvCompletion", 'request_id: "x" num_tokens: -5'))
    write("kv_control", "body_bad_status", b"\x01" + encode(
        "KvCompletion", 'request_id: "x" status_code: 2147483647'))
    for tp in (1, 2, 4):
        write("kv_control", f"descriptor_tp{tp}", b"\x02\x14\x00" + encode(
            "TransferDescriptor", descriptor(tp=tp)))
    write("kv_control", "descriptor_prefill_tp2", b"\x02\x14\x01" + encode(
        "TransferDescriptor", descriptor(tp=1)))
    # Hostile: heads * tp past int32 (found a signed overflow in the descriptor check: the
    # regression seed of that fix), page ids at the top of int32, regions that cannot hold
    # them, 2^64 - 1 bytes, a negative page id, repeated (overlapping) pages.
    write("kv_control", "descriptor_overflowing_heads", b"\x02\x14\x00" + encode(
        "TransferDescriptor", descriptor(tp=4, heads=1 << 30)))
    write("kv_control", "descriptor_huge_page", b"\x02\x14\x00" + encode(
        "TransferDescriptor", descriptor(pages=(0, I32_MAX))))
    write("kv_control", "descriptor_small_region", b"\x02\x14\x00" + encode(
        "TransferDescriptor", descriptor(region_bytes=1024)))
    write("kv_control", "descriptor_max_region", b"\x02\x14\x00" + encode(
        "TransferDescriptor", descriptor(region_bytes=U64_MAX, pages=(0, 1 << 30))))
    write("kv_control", "descriptor_negative_page", b"\x02\x14\x00" + encode(
        "TransferDescriptor", descriptor(pages=(0, -1))))
    write("kv_control", "descriptor_overlapping_pages", b"\x02\x30\x00" + encode(
        "TransferDescriptor", descriptor(pages=(3, 3, 3))))


# --- nccl_frame: selector 0 = a whole control message, 1 = the bytes after the magic,
# 2 = a region rkey.

MAGIC = b"\x00ESTNCCL"


def u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v):
    return struct.pack("<Q", v & U64_MAX)


def s32(b):
    return u32(len(b)) + b


def nccl_frame():
    frames = {
        "user": bytes([1]) + b"an escaped user message",
        "hello": bytes([2]) + u64(7) + u32(1) + s32(b"group-0") + s32(b"peer-address"),
        "put": bytes([3]) + u64(7) + u64(1) + u64(3) + u64(4096) + u64(65536),
        "flush": bytes([4]) + u64(7) + u64(1),
        "close": bytes([5]) + u64(7),
        "abort": bytes([6]) + u64(7) + u32(14) + s32(b"sender aborted"),
        "ready": bytes([7]) + u64(7),
        "ack": bytes([8]) + u64(7) + u64(1),
        "fail": bytes([9]) + u64(7) + u32(13) + s32(b"receiver failed"),
        # Hostile: a length of 2^32 - 1 with nothing behind it, offsets and sizes at 2^64 - 1,
        # an unknown type, a truncated field, a code outside absl's.
        "hello_huge_length": bytes([2]) + u64(7) + u32(1) + u32(0xFFFFFFFF) + b"x",
        "put_max_offset": bytes([3]) + u64(7) + u64(U64_MAX) + u64(U64_MAX) + u64(U64_MAX)
                          + u64(U64_MAX),
        "unknown_type": bytes([200]) + u64(7),
        "flush_truncated": bytes([4]) + u64(7)[:5],
        "fail_bad_code": bytes([9]) + u64(7) + u32(0xFFFFFFFF) + s32(b""),
    }
    for name, body in frames.items():
        write("nccl_frame", f"message_{name}", b"\x00" + MAGIC + body)
        write("nccl_frame", f"body_{name}", b"\x01" + body)
    write("nccl_frame", "rkey", b"\x02" + b"NCR1" + u64(0x1234) + u64(5))
    write("nccl_frame", "rkey_short", b"\x02" + b"NCR1" + u64(1))


# --- request_proto: selector 0 = GenerateRequest, 1 = ReserveRequest, 2 = DecodeRequest,
# 3 = PrefillRequest.

SAMPLING = ('sampling { temperature: 0.7 top_p: 0.9 top_k: 40 min_p: 0.05 seed: 7 max_tokens: 16 '
            'stop: "The end" stop_token_ids: 2 repetition_penalty: 1.1 presence_penalty: 0.5 '
            'frequency_penalty: 0.5 min_tokens: 2 logit_bias { key: 5 value: 1.5 } logprobs: 3 }')
WORKER_REQUEST = (f'request_id: "req-1" prompt_ids: 1 prompt_ids: 403 prompt_ids: 407 '
                  f'{SAMPLING} exit {{ threshold: 0.8 mode: EXIT_MODE_LOSSY }} '
                  f'deadline_unix_ms: 1700000000000')


def request_proto():
    gen = {
        "text": 'text: "Once upon a time" sampling { temperature: 0 max_tokens: 16 }',
        "tokens": f'tokens {{ ids: 1 ids: 403 ids: 407 }} {SAMPLING} exit {{ threshold: 0.9 }}',
        "lossless": 'text: "Hi" exit { mode: EXIT_MODE_LOSSLESS } same_prompt_as: "req-0"',
        # Hostile: 2^31 - 1 new tokens, ids outside the vocabulary, 17 stop strings, a NaN
        # threshold, an unknown exit mode, min_tokens past max_tokens, 2^31 - 1 logprobs.
        "huge_max_tokens": f'text: "x" sampling {{ max_tokens: {I32_MAX} }}',
        "bad_ids": f'tokens {{ ids: -1 ids: {I32_MAX} }}',
        "many_stops": "text: \"x\" sampling { " + " ".join(
            f'stop: "s{i}"' for i in range(17)) + " }",
        "nan_threshold": 'text: "x" exit { threshold: nan mode: 7 }',
        "min_tokens": 'text: "x" sampling { max_tokens: 2 min_tokens: 100 }',
        "huge_logprobs": f'text: "x" sampling {{ logprobs: {I32_MAX} top_k: -5 top_p: inf }}',
        "empty": "",
    }
    for name, text in gen.items():
        write("request_proto", f"generate_{name}", b"\x00" + encode("GenerateRequest", text))
    write("request_proto", "reserve", b"\x01" + encode(
        "ReserveRequest", f"request {{ {WORKER_REQUEST} }} lease_ms: 30000"))
    write("request_proto", "reserve_hostile", b"\x01" + encode(
        "ReserveRequest", f'request {{ request_id: "" prompt_ids: {I32_MAX} '
                          f'deadline_unix_ms: 9223372036854775807 sampling {{ temperature: -1 '
                          f'logit_bias {{ key: -7 value: inf }} }} }} '
                          f'lease_ms: -9223372036854775808'))
    write("request_proto", "decode_local_prefill", b"\x02" + encode(
        "DecodeRequest", f"local_prefill {{ {WORKER_REQUEST} }}"))
    write("request_proto", "prefill", b"\x03" + encode(
        "PrefillRequest", f"request {{ {WORKER_REQUEST} }} transfer {{ {descriptor()} }}"))
    write("request_proto", "prefill_overflowing_heads", b"\x03" + encode(
        "PrefillRequest", f"request {{ {WORKER_REQUEST} }} "
                          f"transfer {{ {descriptor(tp=4, heads=1 << 30)} }}"))


# --- llama2c_files: selector 0 = model.bin, 1 = tokenizer.bin (then two bytes: vocab - 259).

def llama2c_model(dim, hidden, layers, heads, kv_heads, vocab, seq_len, floats=None):
    header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, seq_len)
    if floats is None:  # the size the loader expects (llama2c_checkpoint.cc)
        hd = dim // heads
        v = abs(vocab)
        floats = (v * dim + layers * dim + layers * heads * hd * dim
                  + 2 * layers * kv_heads * hd * dim + layers * dim * heads * hd + layers * dim
                  + 3 * layers * hidden * dim + dim + seq_len * hd)
        if vocab < 0:
            floats += v * dim
    body = b"".join(struct.pack("<f", ((i * 37) % 101) / 101.0 - 0.5) for i in range(floats))
    return header + body


def llama2c_files():
    write("llama2c_files", "model_tiny_tied", b"\x00" + llama2c_model(8, 16, 1, 2, 2, 32, 8))
    write("llama2c_files", "model_tiny_untied", b"\x00" + llama2c_model(8, 16, 2, 2, 1, -32, 8))
    write("llama2c_files", "model_header_only", b"\x00" + llama2c_model(64, 172, 5, 8, 4, 512,
                                                                        512, floats=0))
    # Hostile headers: INT32_MIN vocabulary, dims whose products overflow 32 bits, zero and
    # negative counts, 2^31 - 1 everywhere, a file one float longer than its header says.
    write("llama2c_files", "model_int32_min_vocab",
          b"\x00" + llama2c_model(8, 16, 1, 2, 2, -(1 << 31), 8, floats=4))
    write("llama2c_files", "model_overflowing_dims",
          b"\x00" + llama2c_model(1 << 16, 1 << 18, 1024, 1024, 1024, 1 << 22, 1 << 21, floats=4))
    write("llama2c_files", "model_max_dims",
          b"\x00" + llama2c_model(I32_MAX, I32_MAX, I32_MAX, 1, 1, I32_MAX, I32_MAX, floats=4))
    write("llama2c_files", "model_zero_heads", b"\x00" + llama2c_model(8, 16, 1, 0, 0, 32, 8,
                                                                       floats=4))
    write("llama2c_files", "model_one_float_long",
          b"\x00" + llama2c_model(8, 16, 1, 2, 2, 32, 8) + struct.pack("<f", 1.0))
    with open(os.path.join(ROOT, "models/stories260K/tokenizer.bin"), "rb") as f:
        tokenizer = f.read()
    write("llama2c_files", "tokenizer_stories260K", b"\x01" + struct.pack("<H", 512 - 259)
          + tokenizer)
    # Hostile tokenizers: a 2^31 - 1 max_token_length, a negative and a huge token length, a
    # vocabulary far larger than the file, a truncated piece.
    pieces = b"".join(struct.pack("<fi", 0.0, 1) + bytes([i % 256]) for i in range(259))
    write("llama2c_files", "tokenizer_min_vocab", b"\x01\x00\x00" + struct.pack("<i", 4) + pieces)
    write("llama2c_files", "tokenizer_huge_max_length",
          b"\x01\x00\x00" + struct.pack("<i", I32_MAX) + pieces)
    write("llama2c_files", "tokenizer_negative_length",
          b"\x01\x00\x00" + struct.pack("<i", 4) + struct.pack("<fi", 0.0, -1) + pieces)
    write("llama2c_files", "tokenizer_huge_length",
          b"\x01\x00\x00" + struct.pack("<i", 64 << 10) + struct.pack("<fi", 0.0, I32_MAX))
    write("llama2c_files", "tokenizer_huge_vocab", b"\x01\xff\xff" + struct.pack("<i", 4) + pieces)
    write("llama2c_files", "tokenizer_truncated_piece",
          b"\x01\x00\x00" + struct.pack("<i", 4) + pieces[:-1])


# --- hf_config: JSON text (config.json; the target also applies it as generation_config.json).

def hf_config():
    llama32_1b = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "vocab_size": 128256}
    seeds = {
        "llama32_1b.json": json.dumps(llama32_1b, indent=2),
        "tiny.json": json.dumps({"model_type": "llama", "hidden_size": 64,
                                 "intermediate_size": 172, "num_hidden_layers": 5,
                                 "num_attention_heads": 8, "num_key_value_heads": 4,
                                 "vocab_size": 512, "max_position_embeddings": 512,
                                 "bos_token_id": 1, "eos_token_id": 2}),
        "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": [2, 1],
                                              "temperature": 0.6, "top_p": 0.9}),
        # Hostile: 2^31 - 1 and 2^63 dims, negative and fractional counts, products that
        # overflow, wrong types, nulls, an unknown rope type, deep nesting, a huge EOS list.
        "huge_dims.json": json.dumps({"model_type": "llama", "hidden_size": I32_MAX,
                                      "intermediate_size": 1 << 63, "num_hidden_layers": I32_MAX,
                                      "num_attention_heads": 1, "vocab_size": I32_MAX}),
        "overflowing_head_dim.json": json.dumps({"model_type": "llama", "hidden_size": 65536,
                                                 "num_attention_heads": 1024,
                                                 "num_key_value_heads": 1024, "head_dim": 1024,
                                                 "intermediate_size": 262144,
                                                 "num_hidden_layers": 1024,
                                                 "vocab_size": 4194304,
                                                 "max_position_embeddings": 2097152}),
        "negative.json": json.dumps({"model_type": "llama", "hidden_size": -64,
                                     "num_attention_heads": 0, "vocab_size": -1,
                                     "rms_norm_eps": -1.0, "rope_theta": 0}),
        "wrong_types.json": json.dumps({"model_type": ["llama"], "hidden_size": "64",
                                        "num_attention_heads": 8.5, "vocab_size": None,
                                        "eos_token_id": {"a": 1}, "rope_scaling": 3}),
        "rope_unknown.json": json.dumps({"model_type": "llama", "hidden_size": 64,
                                         "num_attention_heads": 8, "intermediate_size": 172,
                                         "num_hidden_layers": 1, "vocab_size": 512,
                                         "rope_scaling": {"rope_type": "yarn", "factor": 1e300}}),
        "deep.json": "[" * 4000 + "]" * 4000,
        "huge_eos_list.json": json.dumps({"model_type": "llama", "hidden_size": 64,
                                          "num_attention_heads": 8, "vocab_size": 512,
                                          "eos_token_id": list(range(-5, 3000))}),
    }
    for name, text in seeds.items():
        write("hf_config", name, text.encode())


def main():
    kv_control()
    nccl_frame()
    request_proto()
    llama2c_files()
    hf_config()
    print("seeds written under", CORPUS)


if __name__ == "__main__":
    sys.exit(main())

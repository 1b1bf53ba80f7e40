#!/usr/bin/python3
"""Checks the /metrics of a running Estuary cluster with an independent parser.

Parses each process's Prometheus text with the reference client library's parser
(Debian python3-prometheus-client), not with string compares, and checks the series of
metrics parity (README "Metrics"): the router's model_name label, token counters equal to the
requests' usage sums, the inter-token latency histogram; the workers' queue depth, KV
utilisation in [0, 1], preemptions and prefix-cache counters. Run by metrics_parity_test.cc
after it served the requests whose sums it passes here (and, with --streaming N, while N
requests stream: the running gauges). Exit status 1 names every failed check.
"""

import argparse
import math
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
    return ok


class Scrape:
    """Every sample of one /metrics page, with the families' types."""

    def __init__(self, name, url):
        self.name = name
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode("utf-8")
        self.types = {}
        self.samples = []
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.types[sample.name] = family.type
                self.samples.append(sample)

    def find(self, name, **labels):
        return [s for s in self.samples
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name, kind, **labels):
        """The one sample `name` with `labels`, checked to be of family type `kind`."""
        found = self.find(name, **labels)
        if not check(len(found) == 1,
                     f"{self.name}: {name}{labels or ''}: {len(found)} samples, want 1"):
            return math.nan
        check(self.types[name] == kind,
              f"{self.name}: {name} is a {self.types[name]}, want a {kind}")
        return found[0].value

    def histogram(self, name, **labels):
        """(count, sum) of histogram `name`, its buckets checked cumulative up to +Inf."""
        buckets = self.find(name + "_bucket", **labels)
        check(self.types.get(name + "_bucket") == "histogram",
              f"{self.name}: {name} is not a histogram")
        bounds = [(float(s.labels["le"]), s.value) for s in buckets]
        check(bounds == sorted(bounds) and bounds and math.isinf(bounds[-1][0]),
              f"{self.name}: {name} buckets not cumulative to +Inf: {bounds}")
        count = self.value(name + "_count", "histogram", **labels)
        check(bounds and bounds[-1][1] == count,
              f"{self.name}: {name} +Inf bucket {bounds[-1:]} != count {count}")
        return count, self.value(name + "_sum", "histogram", **labels)


def check_engine(scrape):
    """The series both worker roles expose (worker/engine_metrics.h), every one labelled with
    the worker's model_name (its --model-id)."""
    for sample in scrape.samples:
        check(sample.labels.get("model_name", "") != "",
              f"{scrape.name}: {sample.name}{sample.labels} has no model_name label")
    waiting = scrape.value("estuary:num_requests_waiting", "gauge")
    check(waiting >= 0, f"{scrape.name}: num_requests_waiting {waiting} < 0")
    running = scrape.value("estuary:num_requests_running", "gauge")
    check(running >= 0, f"{scrape.name}: num_requests_running {running} < 0")
    usage = scrape.value("estuary:kv_cache_usage_perc", "gauge")
    check(0 <= usage <= 1, f"{scrape.name}: kv_cache_usage_perc {usage} not in [0, 1]")
    preemptions = scrape.value("estuary:num_preemptions_total", "counter")
    check(preemptions >= 0, f"{scrape.name}: num_preemptions_total {preemptions} < 0")
    queries = scrape.value("estuary:prefix_cache_queries_total", "counter")
    hits = scrape.value("estuary:prefix_cache_hits_total", "counter")
    check(0 <= hits <= queries,
          f"{scrape.name}: prefix cache hits {hits} not in [0, queries {queries}]")
    return queries, hits


def report(samples):
    for failure in failures:
        print("FAILED:", failure)
    print(f"{len(failures)} failed checks over {samples} samples")
    return 1 if failures else 0


def check_streaming(router, decode, model, streaming):
    """While `streaming` requests stream: the router and decode worker count them as running."""
    running = router.value("estuary:num_requests_running", "gauge", **model)
    check(running == streaming, f"router: num_requests_running {running}, want {streaming}")
    waiting = router.value("estuary:num_requests_waiting", "gauge", **model)
    check(waiting == 0, f"router: num_requests_waiting {waiting} while streaming, want 0")
    running = decode.value("estuary:num_requests_running", "gauge")
    check(running == streaming, f"decode: num_requests_running {running}, want {streaming}")
    usage = decode.value("estuary:kv_cache_usage_perc", "gauge")
    check(0 < usage <= 1, f"decode: kv_cache_usage_perc {usage} with a request holding pages")
    return report(len(router.samples) + len(decode.samples))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--router", required=True, help="the router's /metrics URL")
    parser.add_argument("--streaming", type=int, default=None,
                        help="only check the running gauges while this many requests stream")
    parser.add_argument("--decode", required=True, help="the decode worker's /metrics URL")
    parser.add_argument("--prefill", help="the prefill worker's /metrics URL")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--requests", type=int, help="requests served")
    parser.add_argument("--prompt-tokens", type=int, help="their usage sum")
    parser.add_argument("--generation-tokens", type=int, help="their usage sum")
    parser.add_argument("--prefill-prompt-tokens", type=int,
                        help="prompt tokens of the requests prefilled on the prefill worker")
    parser.add_argument("--local-prompt-tokens", type=int,
                        help="prompt tokens of the requests prefilled on the decode worker")
    parser.add_argument("--min-prefix-hits", type=int,
                        help="prompt tokens the decode worker must have found cached")
    args = parser.parse_args()

    router = Scrape("router", args.router)
    model = {"model_name": args.model}
    if args.streaming is not None:
        return check_streaming(router, Scrape("decode", args.decode), model, args.streaming)
    prompted = router.value("estuary:prompt_tokens_total", "counter", **model)
    check(prompted == args.prompt_tokens,
          f"router: prompt_tokens_total {prompted} != usage sum {args.prompt_tokens}")
    generated = router.value("estuary:generation_tokens_total", "counter", **model)
    check(generated == args.generation_tokens,
          f"router: generation_tokens_total {generated} != usage sum {args.generation_tokens}")
    finished = router.value("estuary:request_success_total", "counter",
                            finished_reason="length", **model)
    check(finished == args.requests, f"router: {finished} requests ended by length, want "
                                     f"{args.requests}")
    ttft_count, ttft_sum = router.histogram("estuary:time_to_first_token_seconds", **model)
    check(ttft_count == args.requests and ttft_sum > 0,
          f"router: time_to_first_token_seconds count {ttft_count} sum {ttft_sum}")
    itl_count, itl_sum = router.histogram("estuary:inter_token_latency_seconds", **model)
    # Every token after a request's first is one observation (a chunk's gap split over its
    # tokens); tokens that came in the same chunk as the first are not.
    check(0 < itl_count <= args.generation_tokens - args.requests and itl_sum > 0,
          f"router: inter_token_latency_seconds count {itl_count} (at most "
          f"{args.generation_tokens - args.requests}) sum {itl_sum}")
    check(router.value("estuary:num_requests_waiting", "gauge", **model) == 0,
          "router: num_requests_waiting is not 0 once every request ended")
    check(router.value("estuary:num_requests_running", "gauge", **model) == 0,
          "router: num_requests_running is not 0 once every request ended")
    usage = router.value("estuary:kv_cache_usage_perc", "gauge", **model)
    check(0 <= usage <= 1, f"router: kv_cache_usage_perc {usage} not in [0, 1]")
    for name in ("estuary:request_success_total", "estuary:e2e_request_latency_seconds_count",
                 "estuary:request_queue_time_seconds_count"):
        for sample in router.find(name):
            check(sample.labels.get("model_name") == args.model,
                  f"router: {name}{sample.labels} lacks model_name={args.model}")

    decode = Scrape("decode", args.decode)
    queries, hits = check_engine(decode)
    check(queries >= args.local_prompt_tokens,
          f"decode: prefix_cache_queries_total {queries} < the local prompts' "
          f"{args.local_prompt_tokens} tokens")
    check(hits >= args.min_prefix_hits,
          f"decode: prefix_cache_hits_total {hits} < {args.min_prefix_hits}")

    prefill = Scrape("prefill", args.prefill)
    check_engine(prefill)
    prefilled = prefill.value("estuary:prompt_tokens_total", "counter")
    check(prefilled == args.prefill_prompt_tokens,
          f"prefill: prompt_tokens_total {prefilled} != {args.prefill_prompt_tokens}")

    return report(len(router.samples) + len(decode.samples) + len(prefill.samples))


if __name__ == "__main__":
    sys.exit(main())

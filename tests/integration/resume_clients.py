#!/usr/bin/env python3
"""Concurrent generations against `arka serve`, with an executor fault in the middle.

    resume_clients.py URL MODEL OUT.json [--fault kill|stop --pid PID] [--ref REF.json [--continuity]]

Sends the same request set every time: 20 greedy streams, 20 seeded sampling streams (top-k,
top-p, min-p, penalties, min_tokens, logprobs, n = 2, completions and chat), and 4 non-streaming
requests. With --fault, once every stream has started and half of them have received 40 pieces of text (or one has finished), the executor PID is sent SIGKILL
(kill) or SIGSTOP (stop: the gateway's heartbeat check kills it). Each result (per choice: the
text, the finish reason, the sampled tokens' logprobs when asked; usage; whether an error event
came) goes to OUT.json. With --ref, each result must equal the reference's: prints one line per
difference and "N passed, N failed" last (stdlib only: it runs on the GPU host too).

--continuity checks what a resume promises where the backend's arithmetic depends on the batch
(CUDA: a row's logits change with the kernels its step picks, so two undisturbed runs already
differ): no error, the [DONE] marker, every choice with the reference's finish reason and token
count where the request ignores EOS, and one logprob per token where logprobs were asked (a token
lost or sent twice would break the count), instead of the same text.
"""
import json
import os
import signal
import sys
import threading
import time
import urllib.request

N_GREEDY, N_SAMPLED, N_PLAIN = 20, 20, 4
NAMES = ["Lily", "Tom", "Sue", "Ben", "Max", "Anna", "Tim", "Mia", "Sam", "Lucy"]


def requests(model):
    reqs = []
    for i in range(N_GREEDY):
        name = NAMES[i % len(NAMES)]
        if i % 4 == 3:
            reqs.append(("/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": f"Tell me about {name} and the {i} cats."}],
                "max_tokens": 260 + 7 * i, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}))
        else:
            reqs.append(("/v1/completions", {
                "model": model, "prompt": f"Once upon a time, {name} found {i} shiny stones",
                "max_tokens": 260 + 7 * i, "temperature": 0, "ignore_eos": i % 2 == 0, "stream": True,
                "logprobs": 2 if i % 5 == 0 else None, "stream_options": {"include_usage": True}}))
    for i in range(N_SAMPLED):
        name = NAMES[(i + 3) % len(NAMES)]
        body = {"model": model, "prompt": f"One day {name} went to the park with {i} friends",
                "max_tokens": 240 + 9 * i, "temperature": 0.7 + 0.02 * i, "top_p": 0.9, "top_k": 40 if i % 2 else 0,
                "min_p": 0.02 if i % 3 == 0 else 0, "seed": 1000 + i, "ignore_eos": i % 3 != 1, "stream": True,
                "stream_options": {"include_usage": True}}
        if i % 4 == 0:
            body["presence_penalty"] = 0.4
            body["frequency_penalty"] = 0.3
        if i % 4 == 1:
            body["repetition_penalty"] = 1.15
        if i % 5 == 2:
            body["min_tokens"] = 200
        if i % 7 == 3:
            body["logprobs"] = 3
        if i % 6 == 5:
            body["n"] = 2
        if i % 8 == 7:
            reqs.append(("/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": body["prompt"]}],
                **{k: v for k, v in body.items() if k not in ("prompt", "model")}}))
        else:
            reqs.append(("/v1/completions", body))
    for i in range(N_PLAIN):
        reqs.append(("/v1/completions", {
            "model": model, "prompt": f"The little dog {NAMES[i]} had a red ball",
            "max_tokens": 300, "ignore_eos": True, "temperature": 0 if i < 2 else 0.8, "seed": 7 + i}))
    for path, body in reqs:
        for k in [k for k, v in body.items() if v is None]:
            del body[k]
    return reqs


class Run:
    def __init__(self, url, path, body):
        self.url, self.path, self.body = url, path, body
        self.stream = body.get("stream", False)
        self.chunks = 0
        self.started = False  # the response's headers came: the server has the request
        self.done = False
        self.result = {"choices": {}, "error": None, "usage": None, "done_marker": False}

    def choice(self, idx):
        return self.result["choices"].setdefault(str(idx), {"text": "", "finish": None, "logprobs": []})

    def run(self):
        data = json.dumps(self.body).encode()
        req = urllib.request.Request(self.url + self.path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                if not self.stream:
                    d = json.loads(r.read())
                    for c in d["choices"]:
                        ch = self.choice(c["index"])
                        ch["text"] = c.get("text", (c.get("message") or {}).get("content", ""))
                        ch["finish"] = c["finish_reason"]
                        lp = c.get("logprobs")
                        if lp and lp.get("token_logprobs"):
                            ch["logprobs"] = lp["token_logprobs"]
                    self.result["usage"] = d.get("usage")
                    self.chunks = 1
                    return
                self.started = True
                for raw in r:
                    line = raw.decode().rstrip("\n")
                    if not line.startswith("data: "):
                        continue
                    payload = line[6:]
                    if payload == "[DONE]":
                        self.result["done_marker"] = True
                        continue
                    d = json.loads(payload)
                    if "error" in d:
                        self.result["error"] = d["error"]
                        continue
                    if d.get("usage"):
                        self.result["usage"] = d["usage"]
                    for c in d.get("choices", []):
                        ch = self.choice(c["index"])
                        txt = c.get("text")
                        if txt is None:
                            txt = (c.get("delta") or {}).get("content") or ""
                        ch["text"] += txt
                        if c.get("finish_reason"):
                            ch["finish"] = c["finish_reason"]
                        lp = c.get("logprobs")
                        if lp and lp.get("token_logprobs"):
                            ch["logprobs"] += lp["token_logprobs"]
                        if txt:
                            self.chunks += 1
        except Exception as e:  # noqa: BLE001 - any failure is a result to report
            self.result["error"] = {"exception": repr(e)}
        finally:
            self.done = True


def continuity_problem(run, got, want):
    """What breaks --continuity's promise for one request (None: nothing)."""
    ign = run.body.get("ignore_eos", False)
    if sorted(got["choices"]) != sorted(want["choices"]):
        return f"choices {sorted(got['choices'])} vs {sorted(want['choices'])}"
    if not run.stream and len(got["choices"]) != 1:
        return "not one choice"
    for k, b in want["choices"].items():
        a = got["choices"][k]
        if not a["text"]:
            return f"choice {k}: no text"
        if ign and a["finish"] != b["finish"]:
            return f"choice {k}: finish {a['finish']} vs {b['finish']}"
        if "logprobs" in run.body and a["logprobs"] and len(a["logprobs"]) != len(b["logprobs"]) and ign:
            return f"choice {k}: {len(a['logprobs'])} logprobs vs {len(b['logprobs'])}"
    gu, wu = got["usage"] or {}, want["usage"] or {}
    if ign and gu.get("completion_tokens") != wu.get("completion_tokens"):
        return f"usage {gu} vs {wu}"
    if ign and len(got["choices"]) == 1 and "logprobs" in run.body:
        n = len(next(iter(got["choices"].values()))["logprobs"])
        if n != gu.get("completion_tokens"):
            return f"{n} logprobs for {gu.get('completion_tokens')} tokens"
    return None


def main():
    args = sys.argv[1:]
    url, model, out = args[0], args[1], args[2]
    fault = pid = ref = None
    if "--fault" in args:
        fault = args[args.index("--fault") + 1]
        pid = int(args[args.index("--pid") + 1])
    if "--ref" in args:
        ref = json.load(open(args[args.index("--ref") + 1]))
    continuity = "--continuity" in args
    runs = [Run(url, p, b) for p, b in requests(model)]
    threads = [threading.Thread(target=r.run, daemon=True) for r in runs]
    t0 = time.time()
    for t in threads:
        t.start()
    fault_info = {}
    if fault:
        streams = [r for r in runs if r.stream]
        deadline = time.time() + 120
        # every stream under way at the server (its headers came), and well into them: 40 pieces
        # of text in half of them (on a GPU the first ones finish before the slowest reach 40),
        # or one finished
        while time.time() < deadline and not (all(r.started or r.done for r in streams) and (
                any(r.done for r in streams) or sum(1 for r in streams if r.chunks >= 40) >= (len(streams) + 1) // 2)):
            time.sleep(0.002)
        fault_info["in_flight"] = sum(1 for r in runs if not r.done)
        fault_info["chunks_min"] = min((r.chunks for r in streams if not r.done), default=0)
        fault_info["streams_in_flight"] = sum(1 for r in streams if not r.done)
        fault_info["at_s"] = round(time.time() - t0, 3)
        os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    for t in threads:
        t.join(900)
    elapsed = time.time() - t0
    results = [r.result for r in runs]
    json.dump({"results": results, "fault": fault_info, "elapsed_s": round(elapsed, 3)}, open(out, "w"))
    if ref is None:
        bad = [i for i, r in enumerate(results) if r["error"] or not r["choices"]]
        for i in bad:
            print(f"reference request {i} failed: {results[i]['error']}")
        print(f"{len(results) - len(bad)} passed, {len(bad)} failed")
        return
    passed = failed = 0
    for i, (got, want) in enumerate(zip(results, ref["results"])):
        why = None
        if got["error"]:
            why = f"error {got['error']}"
        elif runs[i].stream and not got["done_marker"]:
            why = "the stream ended without [DONE]"
        elif continuity:
            why = continuity_problem(runs[i], got, want)
        elif got["choices"] != want["choices"]:
            for k in sorted(want["choices"]):
                a, b = got["choices"].get(k, {}), want["choices"][k]
                if a != b:
                    at = next((j for j, (x, y) in enumerate(zip(a.get("text", ""), b["text"])) if x != y),
                              min(len(a.get("text", "")), len(b["text"])))
                    why = (f"choice {k} differs at char {at}: finish {a.get('finish')} vs {b['finish']}, "
                           f"...{a.get('text', '')[at:at + 40]!r} vs ...{b['text'][at:at + 40]!r}")
                    break
        elif (got["usage"] or {}).get("completion_tokens") != (want["usage"] or {}).get("completion_tokens"):
            why = f"usage {got['usage']} vs {want['usage']}"
        if why:
            failed += 1
            print(f"request {i} ({runs[i].path}, stream={runs[i].stream}): {why}")
        else:
            passed += 1
    print(f"fault {fault}: {fault_info.get('in_flight')} requests in flight ({fault_info.get('streams_in_flight')} streams, "
          f">= {fault_info.get('chunks_min')} pieces of text each) at {fault_info.get('at_s')} s; all done in {elapsed:.1f} s; "
          f"{passed}/{len(results)} {'continuous (finish, token counts)' if continuity else 'identical to the reference'}")
    print(f"{passed} passed, {failed} failed")


if __name__ == "__main__":
    main()

"""The official `openai` Python client against `hearth serve` on SmolLM2.

    HEARTH_BIN=target/release/hearth .cache/pyenv/bin/python native/cli/tests/serve/test_openai.py
"""

import json
import sys
import unittest

sys.dont_write_bytecode = True
import openai  # noqa: E402
from harness import Server, hearth_run  # noqa: E402

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The capital of France is"


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--parallel", "4", "--max-tokens", "512")
        cls.client = openai.OpenAI(base_url=cls.server.url + "/v1", api_key="none", max_retries=0)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"hearth serve exited {code} on SIGTERM:\n" + "".join(cls.server.log))

    def test_models_lists_the_served_model(self):
        models = self.client.models.list().data
        self.assertEqual([m.id for m in models], ["SmolLM2-135M-Instruct.Q4_1"])

    def test_greedy_chat_equals_hearth_run(self):
        texts, _ = hearth_run("-m", str(self.server_model()), "--chat", "-p", CHAT[0]["content"], "--temp", "0", "-n", "40")
        r = self.client.chat.completions.create(model="any", messages=CHAT, temperature=0, max_tokens=40)
        self.assertEqual(r.choices[0].message.content, "".join(texts))
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.usage.completion_tokens, len(texts))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertEqual(r.object, "chat.completion")

    def test_greedy_completion_equals_hearth_run(self):
        texts, _ = hearth_run("-m", str(self.server_model()), "-p", PROMPT, "--temp", "0", "-n", "24", "--ignore-eos")
        r = self.client.completions.create(model="any", prompt=PROMPT, temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, "".join(texts))
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 24)

    def test_stream_chat_matches_whole_reply_and_reports_usage(self):
        whole = self.client.chat.completions.create(model="m", messages=CHAT, temperature=0, max_tokens=32)
        chunks = list(self.client.chat.completions.create(
            model="m", messages=CHAT, temperature=0, max_tokens=32, stream=True,
            stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finishes, [whole.choices[0].finish_reason])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_stream_completion(self):
        chunks = list(self.client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=12, stream=True))
        whole = self.client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=12)
        self.assertEqual("".join(c.choices[0].text for c in chunks), whole.choices[0].text)

    def test_stop_string_cuts_the_text(self):
        free = self.client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=24, extra_body={"ignore_eos": True})
        self.assertIn(".", free.choices[0].text, "the unconstrained continuation has a full stop to cut at")
        r = self.client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=24, stop=["."])
        self.assertEqual(r.choices[0].text, free.choices[0].text.split(".")[0])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_chat_logprobs(self):
        r = self.client.chat.completions.create(model="m", messages=CHAT, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 8)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 3)
            self.assertLessEqual(t.logprob, 0.0)
            # Greedy: the chosen token is the most likely one.
            self.assertEqual(t.token, t.top_logprobs[0].token)
            self.assertAlmostEqual(t.logprob, t.top_logprobs[0].logprob, places=5)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)

    def test_completion_logprobs(self):
        r = self.client.completions.create(model="m", prompt=PROMPT, temperature=0, max_tokens=6, logprobs=2)
        lp = r.choices[0].logprobs
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertTrue(all(len(t) == 2 for t in lp.top_logprobs))

    def test_n_choices_and_seeds(self):
        kw = dict(model="m", messages=CHAT, temperature=1.0, max_tokens=16, n=3, seed=42, extra_body={"ignore_eos": True})
        a = self.client.chat.completions.create(**kw)
        b = self.client.chat.completions.create(**kw)
        self.assertEqual([c.index for c in a.choices], [0, 1, 2])
        self.assertEqual([c.message.content for c in a.choices], [c.message.content for c in b.choices],
                         "same seed, same choices")
        self.assertGreater(len({c.message.content for c in a.choices}), 1, "choices draw with different seeds")
        self.assertEqual(a.usage.completion_tokens, 3 * 16)
        # The prompt counts once, however many choices.
        one = self.client.chat.completions.create(model="m", messages=CHAT, temperature=0, max_tokens=1)
        self.assertEqual(a.usage.prompt_tokens, one.usage.prompt_tokens)

    def test_prefix_cache_counts_cached_tokens(self):
        long = [{"role": "system", "content": "You are a terse assistant. " * 20}] + CHAT
        self.client.chat.completions.create(model="m", messages=long, temperature=0, max_tokens=2)
        r = self.client.chat.completions.create(model="m", messages=long, temperature=0, max_tokens=2)
        self.assertGreaterEqual(r.usage.prompt_tokens_details.cached_tokens, 16 * (r.usage.prompt_tokens // 16) - 16)
        self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)

    def test_errors_are_openai_errors(self):
        cases = [
            dict(max_tokens=0),
            dict(temperature=-1),
            dict(top_logprobs=5),  # without logprobs
            dict(n=0),
            dict(max_tokens=100000),  # over --max-tokens
        ]
        for kw in cases:
            with self.subTest(kw=kw), self.assertRaises(openai.BadRequestError) as e:
                self.client.chat.completions.create(model="m", messages=CHAT, **kw)
            self.assertIn("message", e.exception.body)
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model="m", messages=[])
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model="m", prompt="word " * 5000, max_tokens=4)
        self.assertEqual(e.exception.code, "context_length_exceeded")

    def test_json_schema_output_validates(self):
        schema = {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "colour": {"enum": ["red", "green", "blue"]}}, "required": ["name", "age", "colour"],
            "additionalProperties": False}
        for seed, temp in [(1, 0), (2, 1.0), (3, 1.0)]:
            r = self.client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Describe a person as JSON."}],
                temperature=temp, seed=seed, max_tokens=120,
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
            with self.subTest(seed=seed, text=r.choices[0].message.content):
                v = json.loads(r.choices[0].message.content)
                self.assertIsInstance(v["name"], str)
                self.assertLessEqual(len(v["name"]), 24)
                self.assertTrue(0 <= v["age"] <= 150)
                self.assertIn(v["colour"], ["red", "green", "blue"])
                self.assertEqual(set(v) - {"name", "age", "colour"}, set())
                self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_json_object_and_grammar(self):
        ask = [{"role": "user", "content": "Reply in JSON: the key colour, and a colour of the rainbow."}]
        r = self.client.chat.completions.create(model="m", messages=ask, temperature=0.8, seed=7, n=4,
                                                max_tokens=100, response_format={"type": "json_object"})
        texts = [c.message.content for c in r.choices]
        self.assertTrue(all(t.startswith("{") for t in texts), texts)
        done = [c.message.content for c in r.choices if c.finish_reason == "stop"]
        self.assertTrue(done, f"some reply closes its object: {texts}")
        for t in done:
            self.assertIsInstance(json.loads(t), dict)
        r = self.client.completions.create(model="m", prompt="Is the sky blue?", temperature=1.0, max_tokens=8,
                                           extra_body={"grammar": 'root ::= "yes" | "no"'})
        self.assertIn(r.choices[0].text, ["yes", "no"])
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model="m", prompt="x", max_tokens=4, extra_body={"grammar": "root ::= ("})

    def test_tool_call_and_its_result(self):
        tools = [{"type": "function", "function": {
            "name": "get_weather", "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = self.client.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="required",
                                                temperature=0, max_tokens=60)
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls")
        self.assertEqual(len(c.message.tool_calls), 1)
        call = c.message.tool_calls[0]
        self.assertEqual(call.function.name, "get_weather")
        self.assertIsInstance(json.loads(call.function.arguments)["city"], str)
        self.assertTrue(call.id.startswith("call_"))
        # The same call streamed.
        chunks = list(self.client.chat.completions.create(model="m", messages=ask, tools=tools, tool_choice="required",
                                                          temperature=0, max_tokens=60, stream=True))
        streamed = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        self.assertEqual([(t.function.name, t.function.arguments) for t in streamed],
                         [(call.function.name, call.function.arguments)])
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        # The result goes back as a tool message; the model answers in text.
        turn = ask + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "clear"}'}]
        r2 = self.client.chat.completions.create(model="m", messages=turn, tools=tools, tool_choice="none",
                                                 temperature=0, max_tokens=30)
        self.assertIsNone(r2.choices[0].message.tool_calls)
        self.assertTrue(r2.choices[0].message.content)
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model="m", messages=ask, tools=tools, max_tokens=4,
                                                tool_choice={"type": "function", "function": {"name": "nope"}})

    def server_model(self):
        from harness import SMOLLM2
        return SMOLLM2


class ApiKey(unittest.TestCase):
    def test_key_required_on_the_api_but_not_health(self):
        server = Server("--api-key", "s3cret")
        try:
            bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
            with self.assertRaises(openai.AuthenticationError):
                bad.models.list()
            good = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
            r = good.completions.create(model="m", prompt=PROMPT, max_tokens=2, temperature=0)
            self.assertEqual(r.usage.completion_tokens, 2)
            self.assertEqual(server.get("/health")[0], 200)
            self.assertEqual(server.post("/tokenize", {"content": "hi"})[0], 401)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)

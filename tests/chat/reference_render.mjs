// Renders every template in templates/ with every case in cases.json using @huggingface/jinja
// (the renderer Hugging Face tooling uses for chat templates) and prints one JSON object:
// {"<template>": {"<case>": {"ok": true, "text": ...} | {"ok": false, "error": ...}}}.
// chat_template_reference_test.cc compares core/chat's output with it byte for byte.
// Content given as text parts is joined with "\n", as core/chat's ChatTemplate does.
import { readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Template } from "@huggingface/jinja";

const here = dirname(fileURLToPath(import.meta.url));
const { variables, cases } = JSON.parse(readFileSync(join(here, "cases.json"), "utf8"));

const flatten = (messages) =>
  messages.map((m) =>
    Array.isArray(m.content) ? { ...m, content: m.content.map((p) => p.text).join("\n") } : m,
  );

const results = {};
for (const file of readdirSync(join(here, "templates")).filter((f) => f.endsWith(".jinja")).sort()) {
  const name = file.slice(0, -".jinja".length);
  const template = new Template(readFileSync(join(here, "templates", file), "utf8"));
  results[name] = {};
  for (const c of cases) {
    const context = {
      ...variables,
      ...(c.variables ?? {}),
      messages: flatten(c.messages),
      add_generation_prompt: c.add_generation_prompt,
    };
    try {
      results[name][c.name] = { ok: true, text: template.render(context) };
    } catch (e) {
      results[name][c.name] = { ok: false, error: String(e.message) };
    }
  }
}
process.stdout.write(JSON.stringify(results));

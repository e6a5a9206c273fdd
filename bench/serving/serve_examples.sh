#!/usr/bin/env bash
# The curl examples of docs/serving.md, run against a fresh `qgmem serve` (prints commands and replies).
# usage: bash bench/serving/serve_examples.sh EXPORT_DIR [PORT]
set -uo pipefail
export_dir=${1:?export folder}; port=${2:-8000}; url=localhost:$port
root=$(mktemp -d)
python -m qgmem serve --export "$export_dir" --store "sqlite:///$root/memories/memories.db" --port "$port" --threads 1 \
  --log-level warning > "$root/serve.log" 2>&1 &
pid=$!
for _ in $(seq 120); do curl -s "$url/healthz" > /dev/null && break; sleep 1; done
cat > "$root/session.json" <<'JSON'
{"time": "2024-05-02T09:00:00", "turns": [
  {"speaker": "User", "text": "I use green for hot leads in my personal spreadsheet."},
  {"speaker": "Assistant", "text": "Green for hot leads, noted."},
  {"speaker": "User", "text": "Yellow marks warm leads and blue is for long-term follow-up."}]}
JSON
show() { echo "\$ $1"; eval "${1//localhost:8000/$url}"; echo; }
cd "$root"
show 'curl -s localhost:8000/v1/users/ana/sessions -H "content-type: application/json" -d @session.json'
show "curl -s localhost:8000/v1/users/ana/answer -H 'content-type: application/json' -d '{\"question\": \"What color do I use for hot leads?\"}' | python -m json.tool"
show "curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' -d '{\"model\": \"qgmem\", \"user\": \"ana\", \"messages\": [{\"role\": \"user\", \"content\": \"Which color marks warm leads?\"}]}'"
show "curl -sN localhost:8000/v1/chat/completions -H 'content-type: application/json' -d '{\"user\": \"ana\", \"stream\": true, \"messages\": [{\"role\": \"user\", \"content\": \"Which color marks warm leads?\"}]}'"
show "curl -s localhost:8000/v1/users/bob/answer -H 'content-type: application/json' -d '{\"question\": \"Where do I live?\"}'"
show "curl -s localhost:8000/v1/users/ana/sessions -H 'content-type: application/json' -d '{\"turns\": [{\"speaker\": \"User\"'"
show "curl -s localhost:8000/v1/users/a%20b/answer -d '{\"question\": \"Where do I live?\"}'"
show 'curl -s localhost:8000/healthz'
show "curl -s localhost:8000/metrics | grep -E '^qgmem_stage_seconds_(sum|count)'"
cat > client.py <<PY
from openai import OpenAI

client = OpenAI(base_url="http://$url/v1", api_key="unused")   # --api-key-env: the real key here
reply = client.chat.completions.create(model="qgmem", user="ana",
                                       messages=[{"role": "user", "content": "What color do I use for hot leads?"}])
print(reply.choices[0].message.content)
for chunk in client.chat.completions.create(model="qgmem", user="ana", stream=True,
                                            messages=[{"role": "user", "content": "Which color marks warm leads?"}]):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY
echo "\$ python client.py"; python client.py
kill -INT "$pid"; wait "$pid"
rm -rf "$root"

"""Makes the secret corpus: fake but well-formed secrets of each provider, each in the context
an agent meets it in (a log line, a JSON body, an env dump, code, a header, a URL).

Every value is random (seeded: the file is reproducible) in the provider's documented shape:
its prefix, alphabet and length, so a detector that knows the format finds it and one that
does not misses it. None of them is a live credential, and none is committed: the tests call
:func:`corpus`, so no secret scanner of a code host flags the repository. Run ``python
generate.py DIR`` to write ``samples.jsonl`` and ``ordinary_generated.txt`` into DIR to read
them; ``ordinary.txt`` beside this file is hand-written text that must come out unchanged.
"""

from __future__ import annotations

import base64
import json
import random
import string
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"


def corpus() -> tuple[list[dict[str, str]], list[str]]:
    """(secret samples, generated ordinary lines), the same on every call."""
    rng = random.Random(20261126)

    def r(n: int, alphabet: str = ALNUM) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    def b64url(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def jwt() -> str:
        head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = b64url(json.dumps({"sub": r(8), "iat": rng.randint(10**9, 2 * 10**9)}).encode())
        return f"{head}.{body}.{b64url(rng.randbytes(32))}"

    def pem() -> str:
        body = base64.b64encode(rng.randbytes(600)).decode()
        lines = "\n".join(body[i : i + 64] for i in range(0, len(body), 64))
        kind = rng.choice(
            ["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY"]
        )
        return f"-----BEGIN {kind}-----\n{lines}\n-----END {kind}-----"

    def basic() -> str:
        return base64.b64encode(f"deploy:{r(14)}".encode()).decode()

    # provider -> (value maker, contexts); {s} is the secret, the rest is what surrounds it
    log = "2026-11-26T07:41:{n:02d}Z INFO http.client request sent with key {s} (attempt 1)"
    jsn = '{{"service": "{p}", "credential": "{s}", "region": "eu-west-1"}}'
    code = 'client = Client(api_key="{s}", timeout=30)'
    providers: dict[str, tuple[Callable[[], str], list[str]]] = {
        "aws_access_key": (
            lambda: rng.choice(["AKIA", "ASIA"]) + r(16, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
            [log, "AWS_ACCESS_KEY_ID={s}", jsn],
        ),
        "aws_secret_key": (
            lambda: r(40, B64),
            [
                "AWS_SECRET_ACCESS_KEY={s}",
                "aws_secret_access_key = {s}",
                '{{"AccessKeyId": "AKIAEXAMPLE", "SecretAccessKey": "{s}"}}',
            ],
        ),
        "github_classic": (lambda: rng.choice(["ghp_", "gho_", "ghs_"]) + r(36), [log, code, jsn]),
        "github_fine_grained": (
            lambda: "github_pat_11" + r(20, UPPER_DIGITS) + "_" + r(59),
            ["export GH_TOKEN={s}", "git push https://x-access-token:{s}@github.com/o/r.git"],
        ),
        "gitlab": (lambda: "glpat-" + r(20, B64URL), [log, "GITLAB_TOKEN={s}", code]),
        "slack_token": (
            lambda: (
                rng.choice(["xoxb-", "xoxp-"])
                + f"{rng.randint(10**10, 10**11)}-{rng.randint(10**12, 10**13)}-"
                + r(24, string.ascii_lowercase + string.digits)
            ),
            [log, jsn, "SLACK_BOT_TOKEN={s}"],
        ),
        "slack_webhook": (
            lambda: (
                f"https://hooks.slack.com/services/T{r(8, UPPER_DIGITS)}/B{r(8, UPPER_DIGITS)}/"
                f"{r(24)}"
            ),
            ["curl -X POST -d @msg.json {s}", 'WEBHOOK = "{s}"'],
        ),
        "stripe": (
            lambda: rng.choice(["sk_live_", "rk_live_"]) + r(rng.choice([24, 99])),
            [log, "STRIPE_SECRET_KEY={s}", 'stripe.api_key = "{s}"'],
        ),
        "openai": (
            lambda: rng.choice(
                [
                    "sk-" + r(20) + "T3BlbkFJ" + r(20),
                    "sk-proj-" + r(74, B64URL) + "T3BlbkFJ" + r(74, B64URL),
                ]
            ),
            [log, "OPENAI_API_KEY={s}", code, jsn],
        ),
        "anthropic": (
            lambda: "sk-ant-api03-" + r(93, B64URL) + "AA",
            ["ANTHROPIC_API_KEY={s}", code, "x-api-key: {s}"],
        ),
        "huggingface": (lambda: "hf_" + r(34, string.ascii_letters), [log, "HF_TOKEN={s}", code]),
        "npm": (
            lambda: "npm_" + r(36),
            ["//registry.npmjs.org/:_authToken={s}", "NPM_TOKEN={s}", log],
        ),
        "pypi": (
            lambda: "pypi-AgEIcHlwaS5vcmc" + r(rng.randint(70, 160), B64URL),
            ["[pypi]\nusername = __token__\npassword = {s}", "TWINE_PASSWORD={s}", log],
        ),
        "google_api_key": (lambda: "AIza" + r(35, B64URL), [log, jsn, code]),
        "twilio": (
            lambda: rng.choice(["AC", "SK"]) + r(32, HEX),
            [log, "TWILIO_ACCOUNT_SID={s}", jsn],
        ),
        "twilio_auth_token": (lambda: r(32, HEX), ["TWILIO_AUTH_TOKEN={s}", '"auth_token": "{s}"']),
        "sendgrid": (
            lambda: "SG." + r(22, B64URL) + "." + r(43, B64URL),
            [log, "SENDGRID_API_KEY={s}", code],
        ),
        "mailgun": (lambda: "key-" + r(32, HEX), [log, 'MAILGUN_API_KEY="{s}"', jsn]),
        "mailchimp": (lambda: r(32, HEX) + "-us" + str(rng.randint(1, 21)), [log, jsn]),
        "jwt": (
            jwt,
            [log, '{{"id_token": "{s}", "expires_in": 3600}}', "Cookie: session={s}; theme=dark"],
        ),
        "private_key": (
            pem,
            [
                "cat ~/.ssh/id_deploy\n{s}\n",
                '{{"private_key": "{s}"}}',
                "key material follows:\n{s}",
            ],
        ),
        "basic_auth_header": (
            basic,
            [
                "Authorization: Basic {s}",
                "curl -H 'Authorization: Basic {s}' https://ci.example.com/api/json",
                "> GET /v1/items HTTP/1.1\n> Host: api.example.com\n> Authorization: Basic {s}\n",
            ],
        ),
        "bearer_token": (
            lambda: r(rng.randint(32, 64), B64URL + "."),
            [
                "Authorization: Bearer {s}",
                "requests.get(url, headers={{'Authorization': 'Bearer {s}'}})",
            ],
        ),
        "db_url_password": (
            lambda: r(rng.randint(10, 24), ALNUM + "!*-_~"),
            [
                "DATABASE_URL=postgres://app:{s}@db.internal:5432/app",
                "connecting to mysql://root:{s}@10.0.0.7:3306/shop ...",
                'MONGO_URI="mongodb+srv://agent:{s}@cluster0.ab12c.mongodb.net/test"',
                "redis://:{s}@cache.internal:6379/0",
                "amqp://worker:{s}@rabbit:5672/%2F",
            ],
        ),
        "env_password": (
            lambda: r(rng.randint(10, 20), ALNUM + "#%^&*!"),
            [
                "PGPASSWORD={s}",
                "MYSQL_PWD={s}",
                "declare -x DB_PASSWORD={s}",
                "SMTP_PASS={s}",
                '{{"username": "svc", "password": "{s}"}}',
            ],
        ),
        "azure_storage": (
            lambda: base64.b64encode(rng.randbytes(66)).decode(),
            [
                "DefaultEndpointsProtocol=https;AccountName=agentlogs;AccountKey={s};EndpointSuffix=core.windows.net",
                'AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=https;AccountName=x;AccountKey={s}"',
            ],
        ),
        "azure_service_bus": (
            lambda: base64.b64encode(rng.randbytes(32)).decode(),
            [
                "Endpoint=sb://orders.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={s}",
            ],
        ),
        "discord": (
            lambda: rng.choice("MNO") + r(25, B64URL) + "." + r(6, B64URL) + "." + r(27, B64URL),
            [log, "DISCORD_BOT_TOKEN={s}", "bot.run('{s}')"],
        ),
        "telegram": (
            lambda: f"{rng.randint(10**8, 10**10 - 1)}:AA" + r(33, B64URL),
            [log, "TELEGRAM_BOT_TOKEN={s}", "https://api.telegram.org/bot{s}/getMe"],
        ),
        "heroku": (
            lambda: "HRKU-AA" + r(58, B64URL),
            ["HEROKU_API_KEY={s}", log],
        ),
        "heroku_legacy": (
            lambda: f"{r(8, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(4, HEX)}-{r(12, HEX)}",
            ["HEROKU_API_KEY={s}", "heroku_api_key: {s}"],
        ),
        "digitalocean": (
            lambda: rng.choice(["dop_v1_", "doo_v1_"]) + r(64, HEX),
            [log, "DIGITALOCEAN_TOKEN={s}", code],
        ),
        "square": (lambda: "sq0csp-" + r(43, B64URL), [log, jsn]),
        "shopify": (lambda: rng.choice(["shpat_", "shpss_"]) + r(32, HEX), [log, code]),
        "ssh_key_field": (
            lambda: "AAAAC3NzaC1lZDI1NTE5AAAAI" + r(43, B64),
            ['{{"ssh_key": "{s}"}}'],
        ),
    }
    rows = []
    for name, (make, contexts) in providers.items():
        for i, ctx in enumerate(contexts):
            secret = make()
            text = ctx.format(s=secret, p=name, n=i)
            assert secret in text
            rows.append({"provider": name, "secret": secret, "text": text})
    return rows, ordinary(rng)


def main(out: Path) -> None:
    rows, lines = corpus()
    with (out / "samples.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"{len(rows)} samples, {len({row['provider'] for row in rows})} providers")
    (out / "ordinary_generated.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} generated ordinary lines")


def ordinary(rng: random.Random) -> list[str]:
    """Text full of long random-looking strings that are not secrets: hashes, ids, digests,
    base64 images, pagination cursors, lock-file integrity lines."""

    def r(n: int, alphabet: str = ALNUM) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    def uuid() -> str:
        return f"{r(8, HEX)}-{r(4, HEX)}-4{r(3, HEX)}-{rng.choice('89ab')}{r(3, HEX)}-{r(12, HEX)}"

    words = ["fix", "add", "remove", "refactor", "update", "docs", "tests", "cache", "parser"]
    out: list[str] = []
    for i in range(20):
        out.append(f"commit {r(40, HEX)}")
        out.append(
            f"{r(7, HEX)} {rng.choice(words)}: {' '.join(rng.choices(words, k=4))} (#{i + 100})"
        )
    for _ in range(15):
        out.append(f"sha256:{r(64, HEX)}  dist/pkg-{rng.randint(1, 9)}.{rng.randint(0, 20)}.tar.gz")
        out.append(f"    --hash=sha256:{r(64, HEX)} \\")
    for _ in range(10):
        out.append(f'{{"run_id": "{uuid()}", "trace_id": "{r(32, HEX)}", "status": "ok"}}')
        out.append(f"request_id={uuid()} span={r(16, HEX)} duration_ms={rng.randint(1, 900)}")
    for _ in range(10):
        blob = base64.b64encode(rng.randbytes(rng.randint(60, 90))).decode()
        out.append(f'<img src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA{blob}" alt="chart">')
        out.append(
            f'{{"type": "image", "source": {{"type": "base64", "media_type": "image/jpeg", '
            f'"data": "/9j/4AAQSkZJRg{blob}"}}}}'
        )
    for _ in range(10):
        cursor = base64.urlsafe_b64encode(rng.randbytes(30)).decode()
        out.append(f'{{"files": [], "nextPageToken": "{cursor}", "incompleteSearch": false}}')
        out.append(
            f'"resolved": "https://registry.npmjs.org/pkg-{r(5, string.ascii_lowercase)}/-/'
            f'pkg-1.0.{rng.randint(0, 9)}.tgz", "integrity": '
            f'"sha512-{base64.b64encode(rng.randbytes(64)).decode()}"'
        )
    for _ in range(10):
        out.append(f"docker pull ghcr.io/acme/agent@sha256:{r(64, HEX)}")
        out.append(
            f"https://storage.example.com/artifacts/{uuid()}/model-{r(6, HEX)}"
            ".safetensors?download=1"
        )
    for _ in range(5):
        out.append(f'ETag: "{r(32, HEX)}"')
        out.append(f"x-request-id: {uuid()}")
        out.append(f"Content-Security-Policy: script-src 'nonce-{r(22, B64URL)}'")
    return out


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]))

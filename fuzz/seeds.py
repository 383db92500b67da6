#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/ (run from the repository root; shared/ beside it).

Real Apple tokens (bodies and bare tokens) from ../shared/fixtures/apple-real, and adversarial
inputs for each parser on the unauthenticated path: the body JSON, base64url, the JWS split, the
header rule, the claims and the events claim. Inputs that libFuzzer finds later are added by
hand (see scripts/fuzz), not by this script.
"""
import base64, json, os, pathlib

root = pathlib.Path(__file__).resolve().parent.parent
fixtures = root.parent / "shared/fixtures/apple-real"
out = root / "fuzz/corpus"
seeds = {}

def b64(data):
    if isinstance(data, str): data = data.encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

def token(header, claims, signature=b"sig"):
    h = header if isinstance(header, (str, bytes)) else json.dumps(header)
    c = claims if isinstance(claims, (str, bytes)) else json.dumps(claims)
    return f"{b64(h)}.{b64(c)}.{b64(signature)}"

def body(jws):
    return json.dumps({"payload": jws})

# Real tokens, as Apple posts them and bare.
for name in ["consent-revoked", "email-disabled", "identity-token"]:
    fixture = json.loads((fixtures / f"{name}.json").read_text())
    seeds[f"real-{name}.jws"] = fixture["jws"]
    seeds[f"real-{name}-body.json"] = fixture.get("http_body", body(fixture["jws"]))

header = {"kid": "fh6Bs8C", "alg": "RS256"}
claims = {"iss": "https://appleid.apple.com", "aud": "com.example.app", "iat": 1700000000, "jti": "j",
          "events": json.dumps({"type": "email-enabled", "sub": "001.a", "event_time": 1700000000123,
                                "email": "x@privaterelay.appleid.com", "is_private_email": "true"})}

# Body JSON: nesting at and past the bound, numbers, escapes, surrogates, NUL, bad UTF-8, keys.
seeds["json-depth-65.json"] = "[" * 65 + "]" * 65
seeds["json-depth-66.json"] = "[" * 66 + "]" * 66
seeds["json-depth-10000-open.json"] = "[" * 10000
seeds["json-deep-objects.json"] = '{"a":' * 64 + "1" + "}" * 64
seeds["json-numbers.json"] = "[0,-0,1e308,1e309,-1e309,1e-400,123456789012345678901234567890,0.1e1,1E+2,-1.5e-7,9007199254740993,4.9e-324]"
seeds["json-bad-number-leading-zero.json"] = "[01]"
seeds["json-bad-number-dot.json"] = "[1.]"
seeds["json-bad-number-minus.json"] = "[-]"
seeds["json-escapes.json"] = r'["\"\\\/\b\f\n\r\t\u0041\u00e9\u2028\ud83d\ude00"]'
seeds["json-bad-escape.json"] = r'["\x"]'
seeds["json-short-unicode-escape.json"] = r'["\u12"]'
seeds["json-lone-high-surrogate.json"] = r'["\ud800"]'
seeds["json-lone-low-surrogate.json"] = r'["\udc00"]'
seeds["json-high-surrogate-then-letter.json"] = r'["\ud800\u0041"]'
seeds["json-two-high-surrogates.json"] = r'["\ud800\ud800"]'
seeds["json-nul-escape.json"] = r'{"payload":"a\u0000b"}'
seeds["json-raw-nul.json"] = b'{"payload":"a\x00b"}'
seeds["json-nul-after.json"] = b'{"payload":"a"}\x00'
seeds["json-invalid-utf8.json"] = b'{"payload":"\xff\xfe"}'
seeds["json-overlong-utf8.json"] = b'{"payload":"\xc0\xaf"}'
seeds["json-utf8-surrogate.json"] = b'{"payload":"\xed\xa0\x80"}'
seeds["json-duplicate-key.json"] = '{"payload":"a","payload":"b"}'
seeds["json-equivalent-keys.json"] = '{"\u00e9":1,"e\u0301":2}'.encode()
seeds["json-trailing-comma.json"] = '{"payload":"a",}'
seeds["json-literals-whitespace.json"] = ' \t\r\n{"a":[true,false,null],"b":{}, "c":[] } \n'
seeds["json-empty.json"] = b""

# The JWS split and base64url.
seeds["jws-many-dots.json"] = body("a.b.c.d.e")
seeds["jws-only-dots.json"] = body("....")
seeds["jws-two-segments.json"] = body(b64(json.dumps(header)) + "." + b64(json.dumps(claims)))
seeds["jws-padding.json"] = body(base64.urlsafe_b64encode(json.dumps(header).encode()).decode() + ".e30=.c2ln")
seeds["jws-standard-alphabet.json"] = body("eyJ+/w.e30.c2ln")
seeds["jws-noncanonical-bits.json"] = body("e30.QR.c2ln")
seeds["jws-length-one-mod-four.json"] = body("e30.e.c2ln")
seeds["jws-whitespace.json"] = "\n " + token(header, claims) + " \u2028\n"
seeds["jws-bom.json"] = "\ufeff" + token(header, claims)

# The header rule.
seeds["header-alg-none.json"] = body(token({"alg": "none", "kid": "k"}, claims, b""))
seeds["header-alg-hs256.json"] = body(token({"alg": "HS256", "kid": "k"}, claims))
seeds["header-no-kid.json"] = body(token({"alg": "RS256"}, claims))
seeds["header-kid-number.json"] = body(token({"alg": "RS256", "kid": 7}, claims))
seeds["header-array.json"] = body(token([], claims))
seeds["header-not-json.json"] = body(token("RS256", claims))

# Claims and the events claim.
def with_events(events, **more):
    return body(token(header, dict(claims, events=events, **more)))
seeds["events-object.json"] = with_events({"type": "consent-revoked", "sub": "001.a", "event_time": 1700000000})
seeds["events-array-two.json"] = with_events([{"type": "consent-revoked", "sub": "a"}, {}])
seeds["events-string-of-string.json"] = with_events(json.dumps("x"))
seeds["events-not-json.json"] = with_events("{type")
seeds["events-time-extremes.json"] = with_events(json.dumps({"type": "account-deleted", "sub": "a", "event_time": "1e400"}), iat=1e300)
seeds["events-time-negative.json"] = with_events(json.dumps({"type": "account-delete", "sub": "a", "event_time": -1, "is_private_email": "TRUE"}))
seeds["events-unknown-type.json"] = with_events(json.dumps({"type": "new-kind", "sub": "a", "event_time": "nan"}))
seeds["events-no-sub.json"] = with_events(json.dumps({"type": "email-enabled", "sub": ""}))
seeds["events-deep.json"] = with_events("[" * 64 + "]" * 64)
seeds["claims-not-object.json"] = body(token(header, "[1,2]"))

out.mkdir(parents=True, exist_ok=True)
for name, content in seeds.items():
    (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
print(f"{len(seeds)} seeds, {sum(len(c) for c in seeds.values())} bytes in {out}")

#!/usr/bin/env python3
"""Verify an agentrun approval assertion in a tool (PyJWT with its crypto extra).

    pip install "PyJWT[crypto]>=2.10,<3"
    python3 examples/verify-approval.py JWKS_FILE ENDPOINT TOKEN BODY_FILE

JWKS_FILE is the controller's JWKS (ConfigMap agentrun-approval-keys, key jwks.json, or
GET http://<controller>:8080/.well-known/jwks.json); ENDPOINT is the URL this tool serves, as
written in the Agent; TOKEN is the Agentrun-Approval header of the call; BODY_FILE holds the
exact request body. Prints the claims and exits 0, or prints why and exits 1.
"""

import hashlib
import json
import sys

import jwt


# --- verify_approval: the check a tool makes (docs/security.md shows these lines) ---
def verify_approval(token: str, jwks: jwt.PyJWKSet, endpoint: str, body: bytes) -> dict:
    header = jwt.get_unverified_header(token)
    if header.get("typ") != "agentrun-approval+jwt":
        raise jwt.InvalidTokenError("not an agentrun approval assertion")
    key = jwks[header["kid"]]  # KeyError: not a published key
    claims = jwt.decode(
        token, key, algorithms=["EdDSA"], audience=endpoint, issuer="agentrun", leeway=30,
        options={"require": ["iss", "aud", "iat", "nbf", "exp", "jti"]},
    )
    if claims["arguments_sha256"] != hashlib.sha256(body).hexdigest():
        raise jwt.InvalidTokenError("the body is not the approved arguments")
    return claims
# --- end ---


def main() -> int:
    jwks_file, endpoint, token, body_file = sys.argv[1:5]
    with open(jwks_file, encoding="utf-8") as f:
        jwks = jwt.PyJWKSet.from_json(f.read())
    with open(body_file, "rb") as f:
        body = f.read()
    try:
        claims = verify_approval(token, jwks, endpoint, body)
    except (jwt.InvalidTokenError, KeyError) as error:
        print(f"refused: {type(error).__name__}: {error}")
        return 1
    print(json.dumps(claims, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

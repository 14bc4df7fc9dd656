"""boto3 as an agent, unchanged: it is configured only by its environment (what
`postern env --agent` prints, and a region). Prints one JSON line with what it got.

    python3 aws_agent.py s3 | bedrock | presigned
"""

import json
import sys

import boto3
from botocore.exceptions import ClientError

CALL = sys.argv[1]


def s3():
    client = boto3.client("s3")
    client.put_object(Bucket="agent-bucket", Key="notes/a.txt", Body=b"written through postern")
    got = client.get_object(Bucket="agent-bucket", Key="notes/a.txt")
    return {"body": got["Body"].read().decode()}


def presigned():
    """A presigned GET made offline with the placeholder, then fetched like any URL."""
    import urllib.error
    import urllib.request
    client = boto3.client("s3")
    client.put_object(Bucket="agent-bucket", Key="shared.txt", Body=b"fetched by a presigned URL")
    url = client.generate_presigned_url(
        "get_object", Params={"Bucket": "agent-bucket", "Key": "shared.txt"}, ExpiresIn=300
    )
    try:
        with urllib.request.urlopen(url) as r:
            return {"body": r.read().decode(), "url_key": "X-Amz-Credential=postern%3Aaws" in url}
    except urllib.error.HTTPError as e:
        raise SystemExit(json.dumps({"ok": False, "status": e.code, "body": e.read().decode()}))


def bedrock():
    client = boto3.client("bedrock-runtime")
    got = client.invoke_model(
        modelId="anthropic.claude-3-haiku-20240307-v1:0",
        body=json.dumps({"prompt": "hello", "max_tokens": 5}),
        contentType="application/json",
        accept="application/json",
    )
    return {"body": got["body"].read().decode()}


try:
    out = {"ok": True, **{"s3": s3, "bedrock": bedrock, "presigned": presigned}[CALL]()}
except ClientError as e:
    err = e.response.get("Error", {})
    meta = e.response.get("ResponseMetadata", {})
    out = {
        "ok": False,
        "code": err.get("Code"),
        "status": meta.get("HTTPStatusCode"),
        "attempts": meta.get("RetryAttempts"),
    }
print(json.dumps(out), flush=True)

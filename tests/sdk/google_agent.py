"""google-auth as an agent, unchanged: Application Default Credentials find the metadata
server `postern env` points at, and an AuthorizedSession calls URL with the token it got.

    python3 google_agent.py URL SCOPE
"""

import json
import sys

import google.auth
from google.auth.transport.requests import AuthorizedSession

url, scope = sys.argv[1], sys.argv[2]
credentials, project = google.auth.default(scopes=[scope])
response = AuthorizedSession(credentials).get(url)
print(json.dumps({
    "status": response.status_code,
    "body": response.text,
    "token": credentials.token,
    "project": project,
    "email": credentials.service_account_email,
}), flush=True)

// The JSON API: every call sends the saved API key, and every failure becomes an ApiError
// carrying the server's {"error": {"code", "message"}}.

const KEY_ITEM = "rag-stream.api-key";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_ITEM) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_ITEM, key);
  else localStorage.removeItem(KEY_ITEM);
}

export function authHeaders(headers = {}) {
  const key = apiKey();
  return key ? { ...headers, Authorization: `Bearer ${key}` } : { ...headers };
}

/** The error a failed response carries (or one made up from its status). */
export function errorFrom(status, text) {
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) {
      return new ApiError(status, body.error.code || "error", body.error.message);
    }
  } catch {
    // not JSON: a proxy's page, say
  }
  return new ApiError(status, "http_" + status, `the server answered ${status}`);
}

export async function request(path, { method = "GET", json, headers = {}, signal } = {}) {
  const init = { method, headers: authHeaders(headers), signal };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError(0, "network_error", "the server cannot be reached");
  }
  const text = await response.text();
  if (!response.ok) throw errorFrom(response.status, text);
  return text ? JSON.parse(text) : null;
}

/** Upload a file into a knowledge base with XMLHttpRequest, for its upload progress events. */
export function upload(kb, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", `/v1/kbs/${encodeURIComponent(kb)}/documents`);
    for (const [name, value] of Object.entries(authHeaders())) xhr.setRequestHeader(name, value);
    xhr.upload.addEventListener("progress", (e) => {
      if (e.lengthComputable) onProgress(e.loaded / e.total);
    });
    xhr.addEventListener("load", () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve(JSON.parse(xhr.responseText));
      else reject(errorFrom(xhr.status, xhr.responseText));
    });
    xhr.addEventListener("error", () =>
      reject(new ApiError(0, "network_error", "the upload was cut off")),
    );
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
}

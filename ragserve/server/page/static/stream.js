// The OpenAI door's server-sent events, read with fetch() and a ReadableStream: each `data:` line's
// JSON chunk in order, until `data: [DONE]`. An error after the stream began arrives as a last
// chunk with `error` (the door's own shape); it is thrown.

export class PageError extends Error {
  constructor(message, status = 0) {
    super(message);
    this.status = status;
  }
}

export function headers(key, json = false) {
  const sent = { "x-request-class": "interactive" };
  if (key) sent.authorization = `Bearer ${key}`;
  if (json) sent["content-type"] = "application/json";
  return sent;
}

// A refusal as one clear sentence: a wrong or missing key names the key field.
export async function refusal(response) {
  let detail = "";
  try {
    detail = (await response.json()).error?.message ?? "";
  } catch {
    detail = response.statusText;
  }
  if (response.status === 401) {
    return new PageError(`The server did not accept the key (401): ${detail}. Enter a valid key above.`, 401);
  }
  if (response.status === 403) {
    return new PageError(`This key may not do that (403): ${detail}`, 403);
  }
  return new PageError(`The server answered ${response.status}: ${detail}`, response.status);
}

export async function getJson(path, key) {
  const response = await fetch(path, { headers: headers(key), cache: "no-store" });
  if (!response.ok) throw await refusal(response);
  return response.json();
}

export async function* chunks(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new PageError(`The answer stopped: ${chunk.error.message}`);
      yield chunk;
    }
  }
}

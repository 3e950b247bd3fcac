// The upload page: sends the chosen file straight to S3 as a multipart upload, as the CLI does.
// 0. check the chosen file's name against the accepted suffixes (data-accepted-suffixes) as soon as
//    it is chosen, so a file of a kind the registry cannot take is refused before anything is sent;
// 1. POST the file's name and size and the version's fields to the uploads API (data-start-url);
// 2. read the file once, part by part, hashing it whole (SHA-256, the version's content address)
//    and each part (MD5 and SHA-256, with the vendored hash-wasm); declare each part's digests
//    (POST .../parts/) and PUT it to the URL the server signed for them, with the Content-MD5 and
//    x-amz-checksum-sha256 headers that URL requires, a few parts at a time, retrying a failed
//    part; the progress bar counts bytes hashed and bytes sent;
// 3. POST .../complete/ with the file's sha256 and poll the upload until the server has verified
//    it, then open the new version's page (data-version-url). Any refusal is shown in #upload-error,
//    as the server's sentence alone, and the progress and its "Verifying…" line are cleared.
(function () {
  "use strict";
  var PARALLEL = 3;
  var ATTEMPTS = 3;
  var POLL_MS = 1000;
  var NIL_ID = "00000000-0000-0000-0000-000000000000";

  function $(id) { return document.getElementById(id); }

  function jsonField(form, name) {
    var text = form.elements[name].value.trim();
    if (!text) { return {}; }
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new Error(name + " is not valid JSON: " + e.message);
    }
  }

  // The reason a file's name gives for refusing it, or "" when its suffix is one the registry takes.
  function refusedName(form, file) {
    var name = file.name.toLowerCase();
    var suffixes = (form.dataset.acceptedSuffixes || "").split(" ").filter(Boolean);
    var known = suffixes.some(function (suffix) { return name.length > suffix.length && name.endsWith(suffix); });
    if (known || !suffixes.length) { return ""; }
    return "cannot tell what kind of model '" + file.name + "' is from its name; the registry accepts " +
      form.dataset.acceptedKinds;
  }

  // The version's metadata with the sample input in it (the field's JSON object, if any).
  function metadataOf(form) {
    var metadata = jsonField(form, "metadata");
    var sample = jsonField(form, "sample_input");
    if (Object.keys(sample).length) {
      if (metadata.sample_input !== undefined) {
        throw new Error("give the sample input in its own field or as metadata.sample_input, not both");
      }
      metadata.sample_input = sample;
    }
    return metadata;
  }

  // The API's error envelope: its sentence, then each refused field's messages (an "invalid" answer).
  function describe(body) {
    if (!body) { return "no answer"; }
    var fields = body.fields || {};
    var lines = Object.keys(fields).map(function (k) { return k + ": " + [].concat(fields[k]).join(" "); });
    return [body.detail || "the server gave no reason"].concat(lines).join("; ");
  }

  function api(form, method, url, body) {
    var csrf = form.elements.csrfmiddlewaretoken.value;
    return fetch(url, {
      method: method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrf },
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (answer) {
      return answer.json().catch(function () { return null; }).then(function (data) {
        if (!answer.ok) {
          throw new Error(data ? describe(data) : "the server answered HTTP " + answer.status + " without a reason");
        }
        return data;
      });
    });
  }

  function megabytes(n) { return (n / 1048576).toFixed(1) + " MiB"; }

  function putPart(url, headers, blob, onProgress) {
    return new Promise(function (resolve, reject) {
      var xhr = new XMLHttpRequest();
      xhr.open("PUT", url);
      Object.keys(headers || {}).forEach(function (name) { xhr.setRequestHeader(name, headers[name]); });
      xhr.upload.onprogress = function (e) { onProgress(e.loaded); };
      xhr.onload = function () {
        if (xhr.status === 200) { onProgress(blob.size); resolve(); } else { reject(new Error("S3 answered HTTP " + xhr.status)); }
      };
      xhr.onerror = function () { reject(new Error("the connection to S3 failed")); };
      xhr.send(blob);
    });
  }

  function readSlice(blob) {
    if (blob.arrayBuffer) { return blob.arrayBuffer(); }
    return new Response(blob).arrayBuffer();
  }

  async function upload(form, file) {
    var bar = $("upload-bar"), status = $("upload-status");
    var sentByPart = {};
    var hashed = 0;
    var total = file.size;
    if (!window.hashwasm) { throw new Error("the hashing library did not load; reload the page"); }

    function showProgress() {
      var sent = Object.keys(sentByPart).reduce(function (s, k) { return s + sentByPart[k]; }, 0);
      // Hashing and sending are both work the user waits for: the bar counts each byte twice.
      var percent = total ? Math.min(100, ((hashed + sent) / (2 * total)) * 100) : 100;
      bar.value = percent;
      status.textContent = "Uploading: " + megabytes(hashed) + " hashed, " + megabytes(sent) + " of " +
        megabytes(total) + " sent (" + percent.toFixed(1) + "%)";
    }

    var body = {
      filename: file.name, size: file.size,
      metadata: metadataOf(form), tags: jsonField(form, "tags"), metrics: jsonField(form, "metrics"),
      source_commit: form.elements.source_commit.value.trim(), ci_run_url: form.elements.ci_run_url.value.trim(),
      training_data_uri: form.elements.training_data_uri.value.trim(),
    };
    var started = await api(form, "POST", form.dataset.startUrl, body);
    var uploadUrl = form.dataset.uploadsUrl.replace(NIL_ID, started.id);
    var whole = await window.hashwasm.createSHA256();
    var running = new Set();
    var failure = null;

    // Declares the part's digests, then PUTs it with the headers its URL is signed for.
    async function sendPart(number, blob, digests) {
      for (var attempt = 0; ; attempt++) {
        try {
          var answer = await api(form, "POST", uploadUrl + "parts/", { parts: [Object.assign({ part_number: number }, digests)] });
          var part = answer.parts[0];
          await putPart(part.url, part.headers, blob, function (loaded) { sentByPart[number] = loaded; showProgress(); });
          return;
        } catch (error) {
          sentByPart[number] = 0;
          if (attempt + 1 >= ATTEMPTS) { throw new Error("part " + number + " could not be sent: " + error.message); }
        }
      }
    }

    showProgress();
    for (var number = 1; number <= started.part_count; number++) {
      while (running.size >= PARALLEL) { await Promise.race(running); }
      if (failure) { throw failure; }
      var offset = (number - 1) * started.part_size;
      var blob = file.slice(offset, Math.min(offset + started.part_size, total));
      var bytes = new Uint8Array(await readSlice(blob));
      whole.update(bytes);
      var digests = { md5: await window.hashwasm.md5(bytes), sha256: await window.hashwasm.sha256(bytes) };
      hashed += bytes.length;
      showProgress();
      var sending = sendPart(number, blob, digests).catch(function (error) { failure = failure || error; });
      running.add(sending);
      sending.then(function () { running.delete(this); }.bind(sending));
    }
    await Promise.all(running);
    if (failure) { throw failure; }

    status.textContent = "Verifying the upload…";
    var state = await api(form, "POST", uploadUrl + "complete/", { sha256: whole.digest("hex") });
    while (state.status !== "completed") {
      if (state.status === "failed" || state.status === "aborted") {
        throw new Error("the upload was refused: " + (state.error || state.status));
      }
      await new Promise(function (resolve) { setTimeout(resolve, POLL_MS); });
      state = await api(form, "GET", uploadUrl);
    }
    status.textContent = "Registered as v" + state.version + ".";
    window.location.assign(form.dataset.versionUrl.replace(/\/0\/$/, "/" + state.version + "/"));
  }

  function showError(message) {
    var error = $("upload-error");
    error.textContent = message;
    error.hidden = false;
  }

  // Back to the form as it was before Upload, keeping the error in view.
  function clearProgress() {
    $("upload-progress").hidden = true;
    $("upload-status").textContent = "";
    $("upload-bar").value = 0;
    $("upload-submit").disabled = false;
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = $("upload-form");
    if (!form) { return; }
    form.elements.artifact.addEventListener("change", function () {
      var file = form.elements.artifact.files[0];
      var refusal = file ? refusedName(form, file) : "";
      $("upload-error").hidden = !refusal;
      if (refusal) { showError(refusal); }
    });
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var file = form.elements.artifact.files[0];
      $("upload-error").hidden = true;
      if (!file) { showError("Choose a file first."); return; }
      var refusal = refusedName(form, file);
      if (refusal) { showError(refusal); return; }
      $("upload-submit").disabled = true;
      $("upload-progress").hidden = false;
      Promise.resolve().then(function () { return upload(form, file); }).catch(function (e) {
        clearProgress();
        showError(e.message);
      });
    });
  });
})();

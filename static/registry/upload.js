// The upload page: sends the chosen file straight to S3 as a multipart upload.
// 1. POST the file's name and size and the version's fields to the uploads API (data-start-url);
// 2. PUT each slice of the file to a presigned part URL, a few at a time, retrying a failed part,
//    with the progress bar counting bytes sent;
// 3. POST .../complete/ and poll the upload until the server has verified it, then open the new
//    version's page (data-version-url). Any refusal is shown in #upload-error.
(function () {
  "use strict";
  var PARALLEL = 3;
  var ATTEMPTS = 3;
  var URL_BATCH = 100;
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

  function describe(body) {
    if (!body) { return "no answer"; }
    if (body.detail) { return body.detail; }
    return Object.keys(body).map(function (k) { return k + ": " + [].concat(body[k]).join(" "); }).join("; ");
  }

  function api(form, method, url, body) {
    var csrf = form.elements.csrfmiddlewaretoken.value;
    return fetch(url, {
      method: method, credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json", "X-CSRFToken": csrf },
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (answer) {
      return answer.json().catch(function () { return null; }).then(function (data) {
        if (!answer.ok) { throw new Error("HTTP " + answer.status + ": " + describe(data)); }
        return data;
      });
    });
  }

  function megabytes(n) { return (n / 1048576).toFixed(1) + " MiB"; }

  function putPart(url, blob, onProgress) {
    return new Promise(function (resolve, reject) {
      var xhr = new XMLHttpRequest();
      xhr.open("PUT", url);
      xhr.upload.onprogress = function (e) { onProgress(e.loaded); };
      xhr.onload = function () {
        if (xhr.status === 200) { onProgress(blob.size); resolve(); } else { reject(new Error("S3 answered HTTP " + xhr.status)); }
      };
      xhr.onerror = function () { reject(new Error("the connection to S3 failed")); };
      xhr.send(blob);
    });
  }

  function upload(form, file) {
    var bar = $("upload-bar"), status = $("upload-status");
    var uploadUrl;
    var sentByPart = {};
    var total = file.size;

    function showProgress() {
      var sent = Object.keys(sentByPart).reduce(function (s, k) { return s + sentByPart[k]; }, 0);
      var percent = total ? Math.min(100, (sent / total) * 100) : 100;
      bar.value = percent;
      status.textContent = "Uploading: " + megabytes(sent) + " of " + megabytes(total) + " (" + percent.toFixed(1) + "%)";
    }

    var body = {
      filename: file.name, size: file.size,
      metadata: jsonField(form, "metadata"), tags: jsonField(form, "tags"), metrics: jsonField(form, "metrics"),
      source_commit: form.elements.source_commit.value.trim(), ci_run_url: form.elements.ci_run_url.value.trim(),
      training_data_uri: form.elements.training_data_uri.value.trim(),
    };
    return api(form, "POST", form.dataset.startUrl, body).then(function (started) {
      uploadUrl = form.dataset.uploadsUrl.replace(NIL_ID, started.id);
      var next = 1, urls = {};

      function urlFor(number) {
        if (urls[number]) { return Promise.resolve(urls[number]); }
        var wanted = [];
        for (var n = number; n <= Math.min(started.part_count, number + URL_BATCH - 1); n++) { wanted.push(n); }
        return api(form, "POST", uploadUrl + "parts/", { part_numbers: wanted }).then(function (answer) {
          answer.parts.forEach(function (p) { urls[p.part_number] = p.url; });
          return urls[number];
        });
      }

      function sendPart(number, attempt) {
        var start = (number - 1) * started.part_size;
        var blob = file.slice(start, Math.min(start + started.part_size, total));
        return urlFor(number).then(function (url) {
          return putPart(url, blob, function (loaded) { sentByPart[number] = loaded; showProgress(); });
        }).catch(function (error) {
          sentByPart[number] = 0;
          if (attempt + 1 >= ATTEMPTS) { throw new Error("part " + number + " could not be sent: " + error.message); }
          delete urls[number];
          return sendPart(number, attempt + 1);
        });
      }

      function worker() {
        if (next > started.part_count) { return Promise.resolve(); }
        var number = next++;
        return sendPart(number, 0).then(worker);
      }

      var workers = [];
      for (var i = 0; i < PARALLEL; i++) { workers.push(worker()); }
      showProgress();
      return Promise.all(workers);
    }).then(function () {
      status.textContent = "Verifying the upload (size and sha256)…";
      return api(form, "POST", uploadUrl + "complete/", {});
    }).then(function poll(state) {
      if (state.status === "completed") { return state; }
      if (state.status === "failed" || state.status === "aborted") {
        throw new Error("the upload was refused: " + (state.error || state.status));
      }
      return new Promise(function (resolve) { setTimeout(resolve, POLL_MS); }).then(function () {
        return api(form, "GET", uploadUrl);
      }).then(poll);
    }).then(function (done) {
      status.textContent = "Registered as v" + done.version + ".";
      window.location.assign(form.dataset.versionUrl.replace(/\/0\/$/, "/" + done.version + "/"));
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = $("upload-form");
    if (!form) { return; }
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var error = $("upload-error"), file = form.elements.artifact.files[0];
      error.hidden = true;
      if (!file) { error.textContent = "Choose a file first."; error.hidden = false; return; }
      $("upload-submit").disabled = true;
      $("upload-progress").hidden = false;
      Promise.resolve().then(function () { return upload(form, file); }).catch(function (e) {
        error.textContent = e.message;
        error.hidden = false;
        $("upload-submit").disabled = false;
      });
    });
  });
})();
